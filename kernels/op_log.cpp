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

OpLog::Compound::Compound(const Ctx& ctx, OpKey key, bool routed) : log_(ctx.log), routed_(routed) {
  if (log_ == nullptr) return;
  log_->note(std::move(key));
  ++log_->inside_;
  log_->routed_ += routed ? 1 : 0;
}

OpLog::Compound::~Compound() {
  if (log_ == nullptr) return;
  --log_->inside_;
  log_->routed_ -= routed_ ? 1 : 0;
}

}  // namespace tr
