#!/usr/bin/env bash
# Regenerates the documents that the attnkit binary prints from its descriptors:
#   docs/support_matrix.md  <- attnkit matrix --format md
# Usage: scripts/gen_docs.sh [path/to/attnkit]   (default: builds build/cpu and uses its binary)
set -euo pipefail
cd "$(dirname "$0")/.."
cli=${1:-}
if [[ -z "$cli" ]]; then
  cmake --preset cpu >/dev/null
  cmake --build build/cpu --target attnkit_cli
  cli=build/cpu/tools/attnkit/attnkit
fi
"$cli" matrix --format md > docs/support_matrix.md
echo "wrote docs/support_matrix.md"
