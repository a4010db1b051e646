#!/usr/bin/env bash
# The dependencies point one way. The layers (DESIGN: core at the bottom; kernels knows nothing
# of parallelism, parallel nothing of Qwen, data and checkpoint nothing of either) and above them
# the trainer's rooms, lowest first: each project #include of a file names its own layer or room
# or one below it. A room may use every layer and the rooms before it in `rooms`.
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
# The trainer's rooms in order: trainer/family (the model families) lowest, since the config
# applies their presets; trainer/checkpoint (which rank writes what, the saver, node-local
# checkpoints, Hugging Face in and out) is the train side over checkpoint/'s HDF5 layer.
rooms=(trainer/family trainer/config trainer/obs trainer/model trainer/optim trainer/layout
       trainer/plan trainer/session trainer/step trainer/checkpoint trainer/run trainer)
below="core kernels parallel data checkpoint"
for room in "${rooms[@]}"; do
  below+=" $room"
  may[$room]=$below
done
# The layer or room of an included path: its room when it is one, else its first folder.
place_of() {
  local path=$1 room
  for room in "${rooms[@]}"; do
    [[ $room != trainer && $path == "$room"/* ]] && { echo "$room"; return; }
  done
  echo "${path%%/*}"
}
bad=0
checked=0
for place in "${!may[@]}"; do
  # A place's own files: not those of a room inside it (trainer/model in trainer).
  while IFS= read -r file; do
    [[ $(place_of "$file") == "$place" ]] || continue
    checked=$((checked + 1))
    while IFS=: read -r line text; do
      inc=$(sed -E 's|^#include "([^"]+)".*|\1|' <<<"$text")
      dep=$(place_of "$inc")
      case " ${may[$place]} absl nlohmann " in *" $dep "*) ;; *)
        echo "$file:$line: $place includes $dep (${text#*#include })"; bad=1 ;;
      esac
    done < <(grep -nE '^#include "[a-z_]+/' "$file")
  done < <(find "$place" \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) \
             -not -path "*/build*" | sort)
done
((checked > 100)) || { echo "test_layers: only $checked files found under $PWD"; exit 1; }
# Above the kernels, the GPU is kernels/device.h and kernels/ops.h: no room includes the CUDA
# backend's own headers (kernels/cuda/).
backend=$(grep -rnE '^#include "kernels/cuda/' trainer)
[[ -z $backend ]] || { echo "rooms including the CUDA backend's headers: $backend"; bad=1; }
# trainer/ holds nothing of its own at the top but main.cpp: everything else is in a room.
loose=$(find trainer -maxdepth 1 -type f \( -name '*.h' -o -name '*.cpp' \) -not -name main.cpp)
[[ -z $loose ]] || { echo "trainer/ files outside a room: $loose"; bad=1; }
((bad == 0)) && echo "test_layers: passed ($checked files)"
exit $bad
