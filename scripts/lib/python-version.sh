# The interpreter scripts/setup and scripts/setup-mxnet are given, and the Python version of an
# interpreter and of a venv (sourced). Versions are "major.minor": a venv's packages are built for
# those two, and a patch release of the same Python keeps them working.

# caller_command COMMAND: COMMAND as the caller named it, for a script about to cd into the checkout:
# a relative path (./python3, venv/bin/python) made absolute from the current folder, which the cd
# would change; a bare name (python3.11) left for PATH to find, an absolute path as it is.
caller_command() {
  if [[ "$1" == */* && "$1" != /* ]]; then printf '%s\n' "$PWD/$1"; else printf '%s\n' "$1"; fi
}

# python_version INTERPRETER: prints its version, or nothing if it is not a command that runs.
python_version() {
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true
}

# venv_version VENV: prints the version of the Python that made the venv (its pyvenv.cfg's
# "version"), or nothing if it has none.
venv_version() {
  sed -n 's/^version *= *\([0-9]*\.[0-9]*\).*/\1/p' "$1/pyvenv.cfg" 2>/dev/null || true
}

# python_found VERSION: what a refusal says was found, from python_version's answer.
python_found() {
  if [ -n "$1" ]; then echo "Python $1"; else echo "not a Python that runs here"; fi
}
