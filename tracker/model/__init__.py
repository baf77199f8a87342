"""The face CNN model: Caffe files (caffe_pb, caffe_io, shapes), the engine and the converters."""
