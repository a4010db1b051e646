#include "kernels/op_log.h"

#include "absl/strings/str_cat.h"

namespace tr {

std::string OpKey::str() const {
  return k == 1 ? absl::StrCat(kernel, " ", m, " x ", n)
                : absl::StrCat(kernel, " ", m, " x ", n, " x ", k);
}

void OpLog::note(OpKey key) {
  if (inside_ == 0) ++counts_[std::move(key)];
}

OpLog::Compound::Compound(const Ctx& ctx, OpKey key) : log_(ctx.log) {
  if (log_ == nullptr) return;
  log_->note(std::move(key));
  ++log_->inside_;
}

OpLog::Compound::~Compound() {
  if (log_ != nullptr) --log_->inside_;
}

}  // namespace tr
