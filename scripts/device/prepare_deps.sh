#!/usr/bin/env bash
# Runs HERE (the development machine), before a device run: copies the header-only dependencies
# and the GoogleTest sources into the git-ignored .deps/ folder as a relocatable prefix, because the
# device machine has none of these packages and cannot fetch them.
#
#   .deps/include/{nlohmann,CLI,dlpack}           headers
#   .deps/share/cmake/{nlohmann_json,CLI11}       CMake package configs (prefix found relative
#   .deps/lib/x86_64-linux-gnu/cmake/dlpack        to the config file, so CMAKE_PREFIX_PATH=.deps
#                                                  works wherever the folder lands)
#   .deps/googletest                              sources (tests/CMakeLists.txt builds them when
#                                                  find_package(GTest) fails)
# Also copies the torch peer script (../shared/peers) into the ignored .peers/ folder. Carry both:
#   run(carry=[".deps", ".peers"], command="bash scripts/device/check.sh")
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
deps="$root/.deps"
rm -rf "$deps"
mkdir -p "$deps/include" "$deps/share/cmake" "$deps/lib/x86_64-linux-gnu/cmake"

cp -r /usr/src/googletest "$deps/googletest"
for h in nlohmann CLI dlpack; do cp -r "/usr/include/$h" "$deps/include/$h"; done
cp -r /usr/share/cmake/nlohmann_json "$deps/share/cmake/"
cp -r /usr/share/cmake/CLI11 "$deps/share/cmake/"
cp -r /usr/lib/x86_64-linux-gnu/cmake/dlpack "$deps/lib/x86_64-linux-gnu/cmake/"
# The configs' "/usr move" shortcut compares against their original absolute location; point it at
# the copy so the relative prefix computation is the only path taken.
for f in "$deps"/share/cmake/*/*.cmake "$deps"/lib/x86_64-linux-gnu/cmake/dlpack/*.cmake; do
  sed -i "s#/usr/lib/x86_64-linux-gnu/cmake/dlpack#\${CMAKE_CURRENT_LIST_DIR}#g; \
s#set(PACKAGE_PREFIX_DIR \"/usr\")#get_filename_component(PACKAGE_PREFIX_DIR \"\${CMAKE_CURRENT_LIST_DIR}/../../../..\" ABSOLUTE)#g" "$f"
done
# GTest's packaged config points at Debian's prebuilt libraries: deliberately not copied.

peers_src="$root/../shared/peers"
if [ -d "$peers_src" ]; then
  rm -rf "$root/.peers"
  cp -r "$peers_src" "$root/.peers"
fi
du -sh "$deps" "$root/.peers" 2>/dev/null
