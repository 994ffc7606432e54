// A trained model in one file: the model spec and every variable, with a
// CRC32, written atomically. The chief exports it at the end of a job;
// `kubetrain eval MODEL` loads it and reports test accuracy.
#ifndef KUBETRAIN_CORE_MODEL_FILE_H_
#define KUBETRAIN_CORE_MODEL_FILE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/file_env.h"
#include "core/model.h"

namespace kubetrain {

struct ModelFile {
  ModelSpec spec;
  Params params;  // layout of Model::Create(spec)->variables()
  int64_t global_step = 0;
  std::string job_name;
  // What eval needs to read data as training did: the spec's
  // spec.training.dataset section as YAML ("" for the IDX defaults), and
  // per-column normalisation (mean, stddev; indexed by column, empty when
  // nothing is normalised) computed from the training files.
  std::string dataset_yaml;
  std::vector<float> norm_mean, norm_std;
};

// Format version 3: version 2 (layer lists, heads, dataset) plus the sparse
// features (sparse inputs, embeddings, the wide part); params hold every
// table whole. Version 2 and version 1 files (softmax and mlp, before layer
// lists) are still read. The payload is streamed from `model` to the file.
// Errors name the path. REQUIRES: params match the spec's variables.
absl::Status WriteModelFile(const std::string& path, const ModelFile& model,
                            FileEnv* env = FileEnv::Default());
// Verifies magic, length, checksum, and that the variables match the spec.
absl::StatusOr<ModelFile> ReadModelFile(const std::string& path);

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_MODEL_FILE_H_
