// Sparse training data in the LIBSVM / SVMlight text format
// (spec.training.dataset.format: libsvm):
//
//   <label> <index>:<value> <index>:<value> ...   # optional comment
//
// Records are lines ('\n' or "\r\n"); everything from a '#' to the end of the
// line is a comment; blank lines are skipped. Tokens are separated by spaces
// or tabs. The label reads per TabularSpec::libsvm_labels: kBinary takes
// 0/1 or -1/+1 (as numbers: "+1", "1.0" and "-1" are fine; -1 and 0 are class
// 0), kClasses an integer class id in [0, libsvm_classes), kRegression any
// finite number. An index is an integer in [index_base, index_base +
// num_features) (index_base 1 as LIBSVM's tools write, or 0), a value a
// finite number; features not listed are 0 (that is what "missing" means in
// this format), indices need not be ascending but may not repeat. A
// "qid:<n>" token (SVMrank) is ignored.
//
// A bad record (a label, index or value that does not parse, an index out of
// range or repeated, a token without ':') fails the load with
// "<file>:<line>: <what>" naming the token, or with skip_bad_records is
// dropped and counted in Dataset::skipped_records.
#ifndef KUBETRAIN_CORE_LIBSVM_H_
#define KUBETRAIN_CORE_LIBSVM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dataset.h"
#include "core/tabular.h"

namespace kubetrain {

// Parses one line into r's ids (0-based, in file order, so a sparse model
// can take them as they are; dense models scatter them into a
// num_features vector), values and label or target; r->dense is cleared.
// False (r untouched) for a blank or comment-only line;
// InvalidArgumentError "<what>" (no file:line) for a bad record. Files are
// read by LoadTabular / OpenTabularTrainingSet (core/tabular.h).
absl::StatusOr<bool> ParseLibsvmLine(const TabularSpec& spec, absl::string_view line, Record* r);

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_LIBSVM_H_
