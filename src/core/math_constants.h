// log2(e) and ln(2) in f32, for host and device code alike: the softmax kernels work in the log2
// domain (one exp2 per score, the softmax scale multiplied by log2(e) once), and the shared input
// checks bound those products.
#pragma once

namespace attnkit {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

}  // namespace attnkit
