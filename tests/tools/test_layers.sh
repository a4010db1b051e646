#!/usr/bin/env bash
# The layers' dependencies point one way (DESIGN: core at the bottom; kernels knows nothing of
# parallelism, parallel nothing of Qwen, data and checkpoint nothing of either): every project
# #include of a layer's files names itself or a layer it may use. trainer/ and tools/ compose
# them all.
#   test_layers.sh SOURCE_DIR
set -uo pipefail
cd "${1:?usage: test_layers.sh SOURCE_DIR}" || exit 2
declare -A may=(
  [core]="core"
  [kernels]="core kernels"
  [parallel]="core kernels parallel"
  [data]="core data"
  [checkpoint]="core checkpoint"
)
bad=0
for layer in "${!may[@]}"; do
  while IFS=: read -r file line text; do
    dep=$(sed -E 's|.*#include "([a-z_]+)/.*|\1|' <<<"$text")
    case " ${may[$layer]} absl nlohmann " in *" $dep "*) ;; *)
      echo "$file:$line: $layer includes $dep/ (${text#*#include })"; bad=1 ;;
    esac
  done < <(grep -rnE '^#include "[a-z_]+/' "$layer" --include='*.h' --include='*.cpp' \
             --include='*.cu' --include='*.cuh')
done
((bad == 0)) && echo "test_layers: passed"
exit $bad
