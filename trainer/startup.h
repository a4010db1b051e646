// Everything checked before the model is built, cheapest first: the config and the layout, the
// backend (and the GPU libraries), the checkpoint to resume (its files' sizes and checksums),
// model.init_from, the data's tokenizer, the batch arithmetic, the memory the run needs against
// what this rank has, every data file (and every token id, on rank 0), and last log.dir and
// checkpoint.dir, which rank 0 then locks. No communication happens here; any error is bad input
// (exit 2), a directory held by a live trainer is busy (exit 6).
#pragma once

#include "absl/status/status.h"
#include "trainer/session.h"

namespace tr {

absl::Status check_inputs(Session& r);

}  // namespace tr
