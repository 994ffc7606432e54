// Kubernetes resource quantities ("500m", "2", "1.5Gi", "1e3", "128974848"),
// as resource.Quantity parses them, held in thousandths of a unit so CPU
// ("250m") and memory ("1Gi") add up exactly. Finer values ("1u", "5n") are
// rounded up to 1m, as the API server rounds a pod's CPU request.
#ifndef KUBETRAIN_CORE_QUANTITY_H_
#define KUBETRAIN_CORE_QUANTITY_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kubetrain {

// The quantity in milli-units; InvalidArgument (saying why) if `text` is not
// a quantity, is negative, or exceeds about 9.2e15 units.
absl::StatusOr<int64_t> ParseQuantityMilli(std::string_view text);

// "4" for 4000, "1500m" for 1500: what the API server accepts back.
std::string FormatQuantityMilli(int64_t milli);

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_QUANTITY_H_
