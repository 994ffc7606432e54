#include "core/memory_budget.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/model.h"
#include "core/placement.h"

namespace kubetrain {
namespace {

// The first line of a small file, "" if it cannot be read.
std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  return std::string(absl::StripAsciiWhitespace(line));
}

int64_t MachineMemory(const std::string& root) {
  std::ifstream in(root + "/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemTotal:") return kb * 1024;
  }
  if (root.empty()) {
    const long pages = ::sysconf(_SC_PHYS_PAGES);
    const long page = ::sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) return static_cast<int64_t>(pages) * page;
  }
  return 0;
}

std::string TaskLabel(const std::string& type, int index) { return absl::StrCat(type, ":", index); }

absl::Status TooBig(const TrainingJob& job, const std::string& who, int64_t need,
                    const std::string& breakdown, const MemoryLimit& limit) {
  const bool layer_list = job.training.model.type == "layers";
  return absl::InvalidArgumentError(absl::StrCat(
      "spec.training.model: needs at least ", FormatBytes(need), " on ", who, " (", breakdown,
      "), more than the ", FormatBytes(limit.bytes), " of ", limit.source, "; use ",
      layer_list ? "smaller layers or a smaller batchSize" : "fewer or smaller hiddenUnits",
      ", more PS replicas, or more memory"));
}

}  // namespace

MemoryLimit DetectMemoryLimit(const std::string& root) {
  MemoryLimit limit;
  limit.bytes = MachineMemory(root);
  limit.source = "the machine's memory (/proc/meminfo MemTotal)";
  struct Candidate {
    const char* path;
    const char* name;
  };
  for (const Candidate& c :
       {Candidate{"/sys/fs/cgroup/memory.max", "memory.max"},
        Candidate{"/sys/fs/cgroup/memory/memory.limit_in_bytes", "memory.limit_in_bytes"}}) {
    const std::string text = FirstLine(root + c.path);
    int64_t bytes = 0;
    if (text.empty() || text == "max" || !absl::SimpleAtoi(text, &bytes) || bytes <= 0) continue;
    if (limit.bytes == 0 || bytes < limit.bytes) {
      limit.bytes = bytes;
      limit.source = absl::StrCat("the cgroup memory limit (", c.name, ")");
    }
    break;
  }
  return limit;
}

absl::StatusOr<int64_t> ParseMemoryQuantity(absl::string_view text) {
  const std::string original(text);
  text = absl::StripAsciiWhitespace(text);
  struct Suffix {
    const char* name;
    int64_t factor;
  };
  static const Suffix kSuffixes[] = {{"Ki", int64_t{1} << 10},
                                     {"Mi", int64_t{1} << 20},
                                     {"Gi", int64_t{1} << 30},
                                     {"Ti", int64_t{1} << 40},
                                     {"Pi", int64_t{1} << 50},
                                     {"Ei", int64_t{1} << 60},
                                     {"k", 1000},
                                     {"K", 1000},
                                     {"M", 1000000},
                                     {"G", 1000000000},
                                     {"T", 1000000000000},
                                     {"P", 1000000000000000},
                                     {"E", 1000000000000000000}};
  int64_t factor = 1;
  for (const Suffix& s : kSuffixes) {
    if (absl::EndsWith(text, s.name)) {
      factor = s.factor;
      text.remove_suffix(std::string_view(s.name).size());
      break;
    }
  }
  double value = 0;
  const bool digits = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return absl::ascii_isdigit(c) || c == '.';
  });
  if (!digits || !absl::SimpleAtod(text, &value) || !(value > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", original, "\" is not a memory size > 0 (e.g. 8Gi, 512Mi, 2G or bytes)"));
  }
  const long double bytes = static_cast<long double>(value) * factor;
  if (bytes >= static_cast<long double>(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("\"", original, "\" is too large"));
  }
  return static_cast<int64_t>(bytes);
}

std::string FormatBytes(int64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  static const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (v >= 1024 && unit < 5) {
    v /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", v, kUnits[unit]);
}

int OptimizerSlots(const std::string& optimizer_type) {
  if (optimizer_type == "adam" || optimizer_type == "ftrl") return 2;
  if (optimizer_type == "momentum" || optimizer_type == "adagrad") return 1;
  return 0;
}

int64_t DynamicTableBookkeepingBytes(int64_t rows) {
  if (rows <= 0) return 0;
  int64_t capacity = 1;  // absl: 2^k - 1, grown when more than 7/8 of it would be full
  while (capacity - capacity / 8 < rows) capacity = capacity * 2 + 1;
  return rows * (8 + 2 * 4) + capacity * (8 + 4 + 4 + 1);
}

namespace {

// Float32 copies of its parts of the dense variables a PS task holds
// (memory_budget.h).
int64_t PsCopies(const TrainingJob& job) {
  const int slots = OptimizerSlots(job.training.optimizer.type);
  const int64_t snapshot = job.training.checkpoint_dir.empty() ? 0 : 1 + slots;
  return 1 + slots + 1 + 1 + snapshot;
}

PsMemory EstimatePsMemory(const TrainingJob& job, const Placement& placement, int shard) {
  const TrainingSpec& t = job.training;
  const bool checkpoints = !t.checkpoint_dir.empty();
  PsMemory m;
  for (const PartPlacement* p : placement.PartsOfShard(shard)) m.dense_bytes += p->num_bytes();
  for (const TablePlacement& table : placement.tables) {
    const int64_t rows = table.ShardRows(shard, placement.num_shards);
    const OptimizerSpec& opt = table.wide && t.wide_optimizer ? *t.wide_optimizer : t.optimizer;
    m.table_bytes += rows * table.dim * 4 * (1 + OptimizerSlots(opt.type));
    if (!table.dynamic) continue;
    m.dynamic_rows += rows;
    m.bookkeeping_bytes += DynamicTableBookkeepingBytes(rows);
  }
  // A checkpoint reads table rows in place (ps/shard.h); of a dynamic table
  // it copies the recency list (4 bytes a slab row) and walks it into the
  // rows' order (8 bytes a row).
  const int64_t snapshot = checkpoints ? m.dynamic_rows * (4 + 8) : 0;
  m.total_bytes = m.dense_bytes * PsCopies(job) + m.table_bytes + m.bookkeeping_bytes + snapshot;
  return m;
}

// One training step's activations at `batch` examples (what Model::
// LossAndGradients keeps for its backward pass, plus conv2d's patch
// gradient), with the layer that holds most of them. The shorthands'
// layers are dense, so their figure is small and no layer is named.
void AddActivations(const Model& model, int64_t batch, ModelMemory* m) {
  const ModelSpec& spec = model.spec();
  std::vector<LayerSpec> layers = spec.layers;
  if (spec.type != "layers") {
    layers.clear();
    for (int units : spec.hidden_units) layers.push_back(LayerSpec{LayerType::kDense, units});
    layers.push_back(LayerSpec{LayerType::kDense, spec.num_classes});
  }
  Shape shape = model.input_shape();
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& layer = layers[i];
    auto out = OutputShape(layer, shape);
    if (!out.ok()) return;               // Model::Create accepted it: cannot happen
    int64_t floats = NumElements(*out);  // the output
    std::string what = absl::StrCat(LayerTypeName(layer.type), ": output ", ShapeString(*out));
    if (layer.type == LayerType::kConv2D) {
      const WindowGeometry g = MakeWindowGeometry(layer, shape);
      floats += 2 * g.positions() * g.patch_size();
      what = absl::StrCat("conv2d: im2col patches [", batch * g.positions(), " x ", g.patch_size(),
                          "] and their gradient");
    } else if (layer.type == LayerType::kMaxPool2D) {
      floats += NumElements(*out);  // int32 argmax per output
    } else if (layer.type == LayerType::kDropout) {
      floats += NumElements(shape);  // the mask
    }
    const int64_t bytes = floats * batch * 4;
    m->activation_bytes += bytes;
    if (spec.type == "layers" && bytes > m->largest_layer_bytes) {
      m->largest_layer = static_cast<int>(i);
      m->largest_layer_bytes = bytes;
      m->largest_layer_what = what;
    }
    shape = *out;
  }
}

int ReaderTasks(const TrainingJob& job) {
  return job.num_workers() + static_cast<int>(job.replica_specs.count("Chief")) +
         static_cast<int>(job.replica_specs.count("Evaluator"));
}

}  // namespace

absl::StatusOr<ModelMemory> EstimateModelMemory(const TrainingJob& job) {
  auto model = Model::Create(job.training.model);
  if (!model.ok()) return model.status();
  ModelMemory m;
  for (const VariableSpec& v : model->variables()) m.model_bytes += v.num_bytes();
  const int num_ps = std::max(1, job.num_ps());
  const Placement placement =
      PlaceVariables(model->variables(), num_ps, job.training.split_threshold_bytes);
  for (int s = 0; s < num_ps; ++s) {
    const PsMemory ps = EstimatePsMemory(job, placement, s);
    m.all_tasks_bytes += ps.total_bytes;
    if (s == 0 || ps.total_bytes > m.largest_ps_bytes) {
      m.largest_ps = s;
      m.largest_ps_bytes = ps.total_bytes;
      m.largest_ps_memory = ps;
    }
  }
  AddActivations(*model, std::max(1, job.training.batch_size), &m);
  m.reader_bytes = 2 * m.model_bytes + m.activation_bytes;
  m.all_tasks_bytes += ReaderTasks(job) * m.reader_bytes;
  return m;
}

namespace {

std::string PsBreakdown(const TrainingJob& job, const PsMemory& m) {
  const int slots = OptimizerSlots(job.training.optimizer.type);
  const bool checkpoints = !job.training.checkpoint_dir.empty();
  std::vector<std::string> parts;
  if (m.dense_bytes > 0 || m.table_bytes == 0) {
    parts.push_back(absl::StrCat(FormatBytes(m.dense_bytes), " of parameters x ", PsCopies(job),
                                 ": values, ",
                                 slots > 0 ? absl::StrCat(slots, " ", job.training.optimizer.type,
                                                          " slot", slots > 1 ? "s, " : ", ")
                                           : std::string(),
                                 "the sync accumulator and a gradient buffer",
                                 checkpoints ? ", and a checkpoint snapshot" : ""));
  }
  if (m.table_bytes > 0) {
    parts.push_back(
        absl::StrCat(FormatBytes(m.table_bytes), " of table rows with their optimizer slots"));
  }
  if (m.dynamic_rows > 0) {
    parts.push_back(
        absl::StrCat(FormatBytes(m.bookkeeping_bytes), " to index ", m.dynamic_rows,
                     " dynamic table rows (ids, LRU links, hash map)",
                     checkpoints ? ", 12 bytes a row more while a checkpoint is written" : ""));
  }
  return absl::StrJoin(parts, "; ");
}

std::string ReaderBreakdown(const TrainingJob& job, const ModelMemory& m) {
  std::string text = absl::StrCat(
      FormatBytes(m.model_bytes), " of parameters x 2: values and gradients, and ",
      FormatBytes(m.activation_bytes), " of activations for a batch of ", job.training.batch_size);
  if (m.largest_layer >= 0) {
    absl::StrAppend(&text, ", ", FormatBytes(m.largest_layer_bytes), " of them in layers[",
                    m.largest_layer, "] ", m.largest_layer_what);
  }
  return text;
}

}  // namespace

absl::Status CheckModelFitsMemory(const TrainingJob& job, const MemoryLimit& limit,
                                  bool tasks_share_limit) {
  if (limit.bytes <= 0) return absl::OkStatus();
  auto m = EstimateModelMemory(job);
  if (!m.ok()) return m.status();
  if (m->largest_ps_bytes > limit.bytes) {
    return TooBig(job, TaskLabel("ps", m->largest_ps), m->largest_ps_bytes,
                  PsBreakdown(job, m->largest_ps_memory), limit);
  }
  if (m->reader_bytes > limit.bytes) {
    return TooBig(job, "each worker", m->reader_bytes, ReaderBreakdown(job, *m), limit);
  }
  if (tasks_share_limit && m->all_tasks_bytes > limit.bytes) {
    return TooBig(
        job,
        absl::StrCat("this machine, for all ", job.num_ps() + ReaderTasks(job), " tasks together"),
        m->all_tasks_bytes,
        absl::StrCat("the PS tasks' shards and ", ReaderBreakdown(job, *m), " per worker"), limit);
  }
  return absl::OkStatus();
}

absl::Status CheckTaskFitsMemory(const TrainingJob& job, const std::string& task_type,
                                 int task_index, const MemoryLimit& limit) {
  if (limit.bytes <= 0) return absl::OkStatus();
  auto m = EstimateModelMemory(job);
  if (!m.ok()) return m.status();
  if (task_type == "ps") {
    auto model = Model::Create(job.training.model);
    if (!model.ok()) return model.status();
    const Placement placement = PlaceVariables(model->variables(), std::max(1, job.num_ps()),
                                               job.training.split_threshold_bytes);
    const PsMemory mine = EstimatePsMemory(job, placement, task_index);
    if (mine.total_bytes > limit.bytes) {
      return TooBig(job, TaskLabel("ps", task_index), mine.total_bytes, PsBreakdown(job, mine),
                    limit);
    }
    return absl::OkStatus();
  }
  if (m->reader_bytes > limit.bytes) {
    return TooBig(job, TaskLabel(task_type, task_index), m->reader_bytes, ReaderBreakdown(job, *m),
                  limit);
  }
  return absl::OkStatus();
}

}  // namespace kubetrain
