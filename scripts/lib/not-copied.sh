# What a copy of the project leaves out, for scripts/install-pi and scripts/test-aarch64 (sourced):
# git's data, the host's venvs, caches, build and run output. Patterns for tar's --exclude, relative to
# the project's root: "./name" only at the top, a bare name or glob at any depth.
# shellcheck disable=SC2034  # used by the scripts that source it
not_copied=(./.git './.venv*' ./build ./.cache ./bench-out ./train-work ./test-artifacts '*.egg-info'
            __pycache__ .pytest_cache .ruff_cache .mypy_cache .hypothesis)
