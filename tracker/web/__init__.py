"""The guard's web page: served by the guard itself (server.py), light enough for a Pi 3.

`tracker.passwords.web_password(config.web)` is what the page requires (None: nothing, for a loopback-only page);
`tracker.stages` starts the server as one of the guard's sinks when `web.enabled`.
"""
