#!/usr/bin/env bash
# Installs the Debian packages attnkit builds with, when missing. Needs root (or sudo) for apt-get;
# otherwise it lists what is missing and exits non-zero.
set -euo pipefail
pkgs=(cmake ninja-build g++ libgtest-dev googletest nlohmann-json3-dev libcli11-dev libdlpack-dev
      libomp-dev clang-format)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "attnkit: installing ${missing[*]}" >&2
if [ "$(id -u)" -eq 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
else
  echo "attnkit: missing packages: ${missing[*]} (run as root or: sudo apt-get install ${missing[*]})" >&2
  exit 1
fi
