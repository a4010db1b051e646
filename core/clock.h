// The clocks the trainer reads: a steady one for durations, the wall clock for timestamps that
// outlive the process (metrics.jsonl, TensorBoard events).
#pragma once

#include <chrono>

namespace tr {

using Clock = std::chrono::steady_clock;

// Seconds from `t` to now.
inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Seconds since the Unix epoch.
inline double unix_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace tr
