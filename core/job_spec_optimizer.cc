// spec.training.optimizer and model.wide.optimizer.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/job_spec.h"
#include "core/job_spec_fields.h"

namespace kubetrain {
namespace spec_internal {

absl::Status ParseOptimizer(const Fields& training, OptimizerSpec* out) {
  Fields f;
  bool present;
  KT_RETURN_IF_ERROR(ReadSection(training, "optimizer",
                                 {"type", "learningRate", "momentum", "nesterov", "beta1", "beta2",
                                  "epsilon", "initialAccumulator", "l1", "l2", "learningRatePower"},
                                 &f, &present));
  if (!present) return absl::OkStatus();
  KT_RETURN_IF_ERROR(ReadString(f, "type", &out->type));
  KT_RETURN_IF_ERROR(
      CheckOneOf(f.PathOf("type"), out->type, {"sgd", "momentum", "adam", "adagrad", "ftrl"}));
  // A hyperparameter of another optimizer is a mistake (e.g. `type: sgd` with
  // `momentum: 0.9` would silently train without momentum).
  static const std::vector<std::pair<std::string, std::vector<std::string>>> kAppliesTo = {
      {"momentum", {"momentum"}},
      {"nesterov", {"momentum"}},
      {"beta1", {"adam"}},
      {"beta2", {"adam"}},
      {"epsilon", {"adam", "adagrad"}},
      {"initialAccumulator", {"adagrad", "ftrl"}},
      {"l1", {"ftrl"}},
      {"l2", {"ftrl"}},
      {"learningRatePower", {"ftrl"}}};
  for (const auto& [key, types] : kAppliesTo) {
    if (f.Has(key) && std::find(types.begin(), types.end(), out->type) == types.end()) {
      return FieldError(f.PathOf(key),
                        absl::StrCat("only applies to type ", absl::StrJoin(types, " or "),
                                     ", but type is ", out->type));
    }
  }
  KT_RETURN_IF_ERROR(ReadDouble(f, "learningRate", &out->learning_rate));
  KT_RETURN_IF_ERROR(ReadDouble(f, "momentum", &out->momentum));
  KT_RETURN_IF_ERROR(ReadBool(f, "nesterov", &out->nesterov));
  KT_RETURN_IF_ERROR(ReadDouble(f, "beta1", &out->beta1));
  KT_RETURN_IF_ERROR(ReadDouble(f, "beta2", &out->beta2));
  KT_RETURN_IF_ERROR(ReadDouble(f, "epsilon", &out->epsilon));
  KT_RETURN_IF_ERROR(ReadDouble(f, "initialAccumulator", &out->initial_accumulator));
  KT_RETURN_IF_ERROR(ReadDouble(f, "l1", &out->l1));
  KT_RETURN_IF_ERROR(ReadDouble(f, "l2", &out->l2));
  KT_RETURN_IF_ERROR(ReadDouble(f, "learningRatePower", &out->learning_rate_power));
  return absl::OkStatus();
}

absl::Status ValidateOptimizer(const OptimizerSpec& o, const std::string& opath) {
  KT_RETURN_IF_ERROR(
      CheckOneOf(opath + ".type", o.type, {"sgd", "momentum", "adam", "adagrad", "ftrl"}));
  KT_RETURN_IF_ERROR(CheckFinite(opath + ".learningRate", o.learning_rate));
  if (!(o.learning_rate > 0)) {
    return FieldError(opath + ".learningRate", absl::StrCat("must be > 0, got ", o.learning_rate));
  }
  for (const auto& [name, value] : {std::pair<const char*, double>{"momentum", o.momentum},
                                    {"beta1", o.beta1},
                                    {"beta2", o.beta2}}) {
    if (!(value >= 0 && value < 1)) {
      return FieldError(opath + "." + name, absl::StrCat("must be in [0, 1), got ", value));
    }
  }
  KT_RETURN_IF_ERROR(CheckFinite(opath + ".epsilon", o.epsilon));
  if (!(o.epsilon > 0)) {
    return FieldError(opath + ".epsilon", absl::StrCat("must be > 0, got ", o.epsilon));
  }
  KT_RETURN_IF_ERROR(CheckFinite(opath + ".initialAccumulator", o.initial_accumulator));
  KT_RETURN_IF_ERROR(CheckAtLeast(opath + ".initialAccumulator", o.initial_accumulator, 0.0));
  for (const auto& [name, value] : {std::pair<const char*, double>{"learningRate", o.learning_rate},
                                    {"momentum", o.momentum},
                                    {"beta1", o.beta1},
                                    {"beta2", o.beta2},
                                    {"epsilon", o.epsilon},
                                    {"initialAccumulator", o.initial_accumulator}}) {
    KT_RETURN_IF_ERROR(CheckFloat32(opath + "." + name, value));
  }
  // A decay that rounds to 1 in float32 never decays (and adam divides by 1 - beta^t).
  for (const auto& [name, value] : {std::pair<const char*, double>{"momentum", o.momentum},
                                    {"beta1", o.beta1},
                                    {"beta2", o.beta2}}) {
    if (!(static_cast<float>(value) < 1.0f)) {
      return FieldError(opath + "." + name,
                        absl::StrCat("must be < 1 as a float32 (", ShortestDouble(value),
                                     " rounds to 1), got ", ShortestDouble(value)));
    }
  }
  for (const auto& [name, value] : {std::pair<const char*, double>{"l1", o.l1}, {"l2", o.l2}}) {
    KT_RETURN_IF_ERROR(CheckFinite(opath + "." + name, value));
    KT_RETURN_IF_ERROR(CheckAtLeast(opath + "." + name, value, 0.0));
  }
  // TF's learning_rate_power: <= 0 (0 is a fixed learning rate; a positive
  // power would make the per-coordinate rate grow with the gradients).
  const std::string power = opath + ".learningRatePower";
  KT_RETURN_IF_ERROR(CheckFinite(power, o.learning_rate_power));
  if (!(o.learning_rate_power <= 0)) {
    return FieldError(power, absl::StrCat("must be <= 0, got ", o.learning_rate_power));
  }
  KT_RETURN_IF_ERROR(CheckFloat32(power, o.learning_rate_power));
  return absl::OkStatus();
}

}  // namespace spec_internal

}  // namespace kubetrain
