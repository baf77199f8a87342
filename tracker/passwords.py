"""Passwords read from files, never from the YAML: the MQTT broker's password and the web page's
(`web_password`, which a page served beyond this machine must have).

`read_secret(path, credential, what)`: the file `path` if the config names one, else systemd's
credential `$CREDENTIALS_DIRECTORY/<credential>` (LoadCredential=, which systemd keeps private) if
it exists, else None. The file's content minus its trailing newline is the secret; an unreadable or
empty file is a ConfigError (exit 2) naming `what` and the file. A file the config names (not a
systemd credential) that its group or others may read or write is warned about, with the chmod
that fixes it, once per process (the guard's preflight and then its sink or page read it again).
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from tracker.config import WebConfig
from tracker.errors import ConfigError
from tracker.files import read_regular_file

log = logging.getLogger(__name__)

MAX_SECRET_BYTES = 4096  # a password, or a token: far less
WEB_CREDENTIAL = "web-password"  # the web page's password under $CREDENTIALS_DIRECTORY (systemd LoadCredential=)
_warned: set[tuple[Path, int]] = set()  # (file, mode) whose mode was warned about: said once, not at each read


@dataclass(frozen=True)
class Secret:
    value: str
    path: Path
    managed: bool  # a systemd credential, not a file the config named


def read_secret(path: Path | None, credential: str, what: str) -> Secret | None:
    """See the module docstring. `what` names the secret in messages, e.g. "mqtt password file"."""
    managed = False
    if path is None and os.environ.get("CREDENTIALS_DIRECTORY"):
        candidate = Path(os.environ["CREDENTIALS_DIRECTORY"]) / credential
        if candidate.is_file():
            path, managed = candidate, True
    if path is None:
        return None
    try:
        mode = path.stat().st_mode
        text = read_regular_file(path, MAX_SECRET_BYTES).decode("utf-8")  # (a video named by mistake was read whole)
    except (OSError, UnicodeDecodeError) as err:
        if getattr(err, "errno", None) == errno.EFBIG:
            raise ConfigError(f"{what} {str(path)!r}: larger than {MAX_SECRET_BYTES} bytes; expected the password") from None
        reason = getattr(err, "strerror", None) or str(err)
        raise ConfigError(f"{what} {str(path)!r}: cannot read ({reason}); "
                          "expected a UTF-8 file readable by the guard's user") from None
    if not managed and mode & 0o077 and (path, mode) not in _warned:
        _warned.add((path, mode))
        log.warning("%s %s is readable by group or others (mode %03o); run: chmod 600 %s", what, path,
                    mode & 0o777, path)
    value = text.rstrip("\r\n")
    if not value:
        raise ConfigError(f"{what} {str(path)!r} is empty; expected the password")
    return Secret(value, path, managed)


def loopback(host: str) -> bool:
    """`host` (a name or an address) is this machine only: localhost (in any case, as DNS names
    are), 127.0.0.0/8 or ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def web_password(config: WebConfig) -> str | None:
    """The page's password: `web.password_file`, else `$CREDENTIALS_DIRECTORY/web-password`, else
    None, which only a loopback-only page may go without (ConfigError, exit 2, otherwise)."""
    secret = read_secret(config.password_file, WEB_CREDENTIAL, "web password file")
    host, _ = config.host_port
    if secret is None and not loopback(host):
        raise ConfigError(f"config: key 'web.listen': {config.listen!r} serves the page beyond this machine without a "
                          f"password; expected web.password_file (or the systemd credential {WEB_CREDENTIAL}), "
                          "or a loopback address such as 127.0.0.1:8080")
    return None if secret is None else secret.value
