#!/usr/bin/env bash
# Regenerates the documents that the attnkit binary prints from its descriptors:
#   docs/support_matrix.md  <- attnkit matrix --format md
#   README.md, between <!-- matrix:begin --> and <!-- matrix:end -->  <- the same, without the
#                           title and with its sections one level down
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
python3 - <<'PY'
import re
matrix = open("docs/support_matrix.md").read().split("\n", 2)[2]  # drop the title and blank line
matrix = re.sub(r"^## ", "### ", matrix, flags=re.M)
readme = open("README.md").read()
begin, end = "<!-- matrix:begin -->\n", "<!-- matrix:end -->"
a, b = readme.index(begin) + len(begin), readme.index(end)
open("README.md", "w").write(readme[:a] + matrix + readme[b:])
PY
echo "wrote docs/support_matrix.md and the matrix section of README.md"
