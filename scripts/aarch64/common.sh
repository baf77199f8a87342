# Shared by scripts/test-aarch64 and scripts/aarch64/build-root (sourced, not run).
#
# Exit codes of the aarch64 run (.ci/run relies on them):
#   0   the suite passed on aarch64
#   77  this machine cannot emulate aarch64 (no root, no qemu, no binfmt_misc, ...): one line says why
#   other  a real failure (a test failed, the root or the venv could not be built)

EXIT_CANNOT_EMULATE=77

# Every input the script takes from the environment, with its default.
AARCH64_CACHE="${TRACKER_AARCH64_CACHE:-/var/cache/tracker-aarch64}"
# qemu-user-static's binary; the test of the script's own failure mode points this at a missing path.
AARCH64_QEMU="${TRACKER_AARCH64_QEMU:-/usr/bin/qemu-aarch64-static}"
AARCH64_BINFMT_DIR="${TRACKER_AARCH64_BINFMT_DIR:-/proc/sys/fs/binfmt_misc}"
# The Raspberry Pi 3's core. Emulating exactly it (ARMv8.0-A: NEON, no dot-product, no half-precision
# arithmetic, no SVE) makes the runtimes pick the kernels they pick on the Pi, and makes a wheel built
# for a newer ARM core fail here with SIGILL as it would on the device, instead of passing on qemu's
# default "max" CPU.
AARCH64_CPU="${TRACKER_AARCH64_CPU:-cortex-a53}"
# What a Raspberry Pi OS Lite image already has that the Pi install path needs: Python 3.11 with venv
# and pip, CA certificates for pip, and the Debian packages scripts/setup asks for (mosquitto for the
# MQTT tests); scripts/setup --pi inside the root installs whatever it lists beyond these.
AARCH64_PACKAGES="python3,python3-venv,python3-pip,ca-certificates,mosquitto,mosquitto-clients,openssl,systemd"
# Bumping this rebuilds every cached root (e.g. after changing the package list in build-root).
AARCH64_ROOT_VERSION=1
AARCH64_SUITE=bookworm

# cannot_emulate REASON: the one-line "cannot emulate here" verdict, exit 77.
# With TRACKER_AARCH64_REASON_FILE set (.ci/run sets it), the same line is also written there so the
# caller can repeat it loudly.
cannot_emulate() {
  local line="test-aarch64: cannot emulate aarch64 on this machine: $*"
  echo "$line" >&2
  if [ -n "${TRACKER_AARCH64_REASON_FILE:-}" ]; then
    # An unwritable reason file must not turn "cannot emulate" into a failure.
    { echo "$line" >"$TRACKER_AARCH64_REASON_FILE"; } 2>/dev/null || echo "test-aarch64: (could not write $TRACKER_AARCH64_REASON_FILE)" >&2
  fi
  exit "$EXIT_CANNOT_EMULATE"
}

# fail REASON: a real failure of the aarch64 run (not an emulation problem), exit 1.
fail() {
  echo "test-aarch64: FAILED: $*" >&2
  exit 1
}

log() { echo "test-aarch64: [$(date -u +%H:%M:%S)] $*"; }

# debian_mirror: the Debian archive URI apt on this machine is configured with for the bookworm
# suite (deb822 .sources or one-line .list format). Only that host is used; nothing is hard-coded.
debian_mirror() { apt_uri_for_suite "$AARCH64_SUITE"; }
debian_security_mirror() { apt_uri_for_suite "$AARCH64_SUITE-security"; }

# apt_uri_for_suite SUITE: first "deb" URI in /etc/apt/sources.list* that serves SUITE with the
# main component; prints nothing if none does.
apt_uri_for_suite() {
  local suite="$1" f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    case "$f" in
      *.sources)
        # deb822: blank-line separated stanzas of "Key: value" fields.
        awk -v suite="$suite" '
          function flush() {
            if (types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " suite " ") && (" " comps " ") ~ / main /) {
              split(uris, u, " "); print u[1]; found = 1; exit
            }
            types = suites = comps = uris = ""
          }
          /^[ \t]*#/ { next }
          /^[ \t]*$/ { flush(); next }
          { key = $1; sub(/:$/, "", key); $1 = ""; sub(/^ +/, "")
            if (key == "Types") types = $0; else if (key == "URIs") uris = $0
            else if (key == "Suites") suites = $0; else if (key == "Components") comps = $0 }
          END { if (!found) flush() }' "$f"
        ;;
      *)
        # one-line: deb [options] URI SUITE COMPONENT...
        awk -v suite="$suite" '
          $1 == "deb" { i = 2; if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
                        if ($(i+1) != suite) next
                        for (j = i + 2; j <= NF; j++) if ($j == "main") { print $i; exit } }' "$f"
        ;;
    esac
  done | head -n1
}
