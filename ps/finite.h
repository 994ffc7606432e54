// Finiteness checks for the PS's hot paths (a push's gradients, an
// optimizer's new values and slots), vectorised.
#ifndef KUBETRAIN_PS_FINITE_H_
#define KUBETRAIN_PS_FINITE_H_

#include <cmath>
#include <cstdint>

#include <eigen3/Eigen/Core>

namespace kubetrain {

// True iff none of p[0, n) is NaN or +-Inf. x * 0 is +-0 for a finite x and
// NaN otherwise, and a NaN survives any sum, so one vectorised sum decides.
// (Eigen's allFinite() and all() are scalar loops with an early exit: on the
// step bench's 0.94 MB model each pass took ~7x as long, and an Adam update
// made three of them.)
inline bool AllFinite(const float* p, int64_t n) {
  return std::isfinite(
      (Eigen::Map<const Eigen::ArrayXf>(p, static_cast<Eigen::Index>(n)) * 0.0f).sum());
}

}  // namespace kubetrain

#endif  // KUBETRAIN_PS_FINITE_H_
