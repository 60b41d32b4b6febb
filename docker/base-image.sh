#!/usr/bin/env bash
# The CPU image's base, made locally from Debian's packages: where no image registry is
# reachable (an air-gapped host), `debootstrap` builds a Debian 12 root and podman imports it
# under the name docker/Dockerfile's `FROM` uses, so the Dockerfile stays the one a user with a
# registry builds. Needs root, debootstrap and podman; the mirror is the host's own apt mirror.
#
#   docker/base-image.sh [--name NAME] [--engine "podman --runtime /usr/sbin/runc"] [--force]
#
# An image of that name already there is kept (--force makes it again): it is made from the
# same suite's packages, so it is a cache like pip's, not a different input.
set -euo pipefail
name=docker.io/library/debian:bookworm-slim
engine="podman --runtime /usr/sbin/runc"
force=0
while [ $# -gt 0 ]; do
  case "$1" in
    --name) name="$2"; shift 2 ;;
    --engine) engine="$2"; shift 2 ;;
    --force) force=1; shift ;;
    *) echo "base-image.sh: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
if [ "$force" = 0 ] && $engine image exists "$name"; then
  echo "base-image.sh: $name is there (--force makes it again)"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "base-image.sh: needs debootstrap (apt-get install debootstrap)" >&2; exit 2; }

# The host's Debian mirror (a deb822 sources file, or the one-line format).
sources=""
for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list.d/*.sources; do
  if [ -f "$f" ]; then sources="$f"; break; fi
done
if [ -n "$sources" ]; then
  mirror=$(awk '/^URIs:/ {print $2; exit}' "$sources")
else
  mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list)
fi
[ -n "$mirror" ] || { echo "base-image.sh: no Debian mirror in the host's apt sources" >&2; exit 2; }

root=$(mktemp -d /var/tmp/tts-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
start=$SECONDS
echo "base-image.sh: debootstrap bookworm (minbase) from the host's mirror (about 3 minutes)"
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.log" 2>&1 \
  || { tail -20 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
# The suites a slim Debian image has (updates and security too), from the host's mirror.
if [ -n "$sources" ]; then
  cp "$sources" "$root/etc/apt/sources.list.d/debian.sources"
  : >"$root/etc/apt/sources.list"
fi
# As a slim image: no package lists, caches or docs.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/*
tar -C "$root" -c . | $engine import --change 'CMD ["bash"]' - "$name" >/dev/null
echo "base-image.sh: $name made in $((SECONDS - start)) s"
