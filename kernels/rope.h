// Rotary embedding's frequencies, in one place for every backend: plain RoPE (pair i of a head
// turns by pos * theta^(-2i/hd)), YaRN's context extension as Hugging Face computes it
// (`rope_type: yarn`: each pair's frequency blends the original one with the one `factor` times
// slower, by a ramp over the pairs between the beta_fast and beta_slow rotation counts of
// original_max_position, and cos and sin are scaled by attention_factor), or Llama 3's
// (`rope_type: llama3`: pairs whose wavelength is under original_max_position /
// high_freq_factor keep their frequency, those over original_max_position / low_freq_factor are
// `factor` times slower, and the ones between blend the two by where their wavelength lies).
#pragma once

#include <vector>

namespace tr {

struct Rope {
  double theta = 1e6;
  bool yarn = false;
  double factor = 1;                 // YaRN: how much longer a context than trained on
  double original_max_position = 0;  // YaRN: the context length the model was trained at
  double beta_fast = 32, beta_slow = 1;
  bool truncate = true;         // YaRN: the ramp's ends rounded outward to whole pairs
  double attention_factor = 1;  // cos and sin are multiplied by it
  bool llama3 = false;          // Llama 3's rule (factor and original_max_position as YaRN's)
  double low_freq_factor = 1, high_freq_factor = 4;

  static Rope plain(double theta) {
    Rope r;
    r.theta = theta;
    return r;
  }
  // YaRN with Hugging Face's defaults; attention_factor 0 means 0.1 ln(factor) + 1.
  static Rope yarn_of(double theta, double factor, double original_max_position,
                      double beta_fast = 32, double beta_slow = 1, double attention_factor = 0,
                      bool truncate = true);

  // Llama 3's rule with its factors (as Llama 3.1's config.json gives them: 8, 1, 4, 8192).
  static Rope llama3_of(double theta, double factor, double low_freq_factor,
                        double high_freq_factor, double original_max_position);

  // The frequency of each of the hd/2 pairs (radians per position), in double.
  std::vector<double> inv_freq(int hd) const;
};

}  // namespace tr
