// The TrainingJob resource (apiVersion kubetrain.io/v1, kind TrainingJob):
// parsed and validated in one place, used by `kubetrain run`, the PS and worker
// tasks, and the operator, so a spec means the same thing everywhere.
// Every field is documented in docs/trainingjob.md.
//
// Parsing is strict: an unknown key anywhere under `spec` is an error that
// names its path (typos must not be silently ignored). Errors are
// absl::InvalidArgumentError with the message "<path>: <what is wrong>", e.g.
// "spec.training.optimizer.learningRate: must be > 0, got -1".
#ifndef KUBETRAIN_CORE_JOB_SPEC_H_
#define KUBETRAIN_CORE_JOB_SPEC_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model.h"
#include "core/tabular.h"

namespace kubetrain {

enum class TrainingMode { kSync, kAsync };

// Per-replica restart policy (TFJob semantics).
enum class RestartPolicy { kNever, kOnFailure, kAlways, kExitCode };

struct ReplicaSpec {
  int replicas = 1;
  RestartPolicy restart_policy = RestartPolicy::kNever;
  // The pod template, kept as YAML text; only the operator interprets it.
  std::string template_yaml;
  // The template's containers are the user's program: it names at least one
  // container and none of them is the runtime container (below).
  bool own_containers = false;
  // template.spec.schedulerName ("" = not set: the default scheduler, or the
  // job's gang scheduler when runPolicy.schedulingPolicy is set).
  std::string scheduler_name;
  // template.spec.priorityClassName ("" = not set).
  std::string priority_class_name;
  // The runtime container's resources.limits.cpu in millicores (0: none).
  int64_t cpu_limit_milli = 0;
  // The threads a task of this replica computes a step on by default: the
  // whole cores of its CPU limit (at least 1, at most 1024), 1 without one.
  // Read from the spec, so `kubetrain run` and the pods compute on the same
  // number of threads and give the same bits.
  int threads() const;
};

// Which PodGroup API a gang scheduler reads (TFJob's --gang-scheduler-name
// rule): "volcano" reads Volcano's (scheduling.volcano.sh/v1beta1), any
// other name is taken for a scheduler-plugins scheduler
// (scheduling.x-k8s.io/v1alpha1, the coscheduling plugin).
enum class GangScheduler { kSchedulerPlugins, kVolcano };
GangScheduler GangSchedulerOf(const std::string& scheduler_name);
const char* GangSchedulerName(GangScheduler scheduler);  // "scheduler-plugins" | "volcano"

// runPolicy.schedulingPolicy (TFJob's): its presence asks for gang
// scheduling, one PodGroup per job (docs/trainingjob.md#gang-scheduling).
struct SchedulingPolicy {
  std::optional<int> min_available;  // tasks that must be placed together; unset: every task
  std::string queue;                 // Volcano's queue ("" = its default)
  std::string priority_class;        // PriorityClass of the PodGroup and of pods naming none
  std::optional<int> schedule_timeout_seconds;  // scheduler-plugins: the gang's wait
  // The PodGroup's minResources, as given (resource name -> quantity); empty:
  // the operator sums the requests of the first minAvailable tasks.
  std::map<std::string, std::string> min_resources;
};

// A template container named `kubetrain` without a `command` is kubetrain's
// runtime container, customised: the operator supplies its command, flags,
// ports and job-file mount; the rest (volumeMounts, env, resources, image,
// ...) is the user's. That is how a job mounts its data into the runtime.
inline constexpr char kRuntimeContainerName[] = "kubetrain";
inline bool IsRuntimeContainer(std::string_view name, bool has_command) {
  return name == kRuntimeContainerName && !has_command;
}

struct RunPolicy {
  std::string clean_pod_policy = "Running";  // "All" | "Running" | "None"
  std::optional<int64_t> ttl_seconds_after_finished;
  std::optional<int64_t> active_deadline_seconds;
  std::optional<int> backoff_limit;
  bool suspend = false;
  std::optional<SchedulingPolicy> scheduling_policy;
};

struct OptimizerSpec {
  std::string type = "sgd";  // "sgd" | "momentum" | "adam" | "adagrad" | "ftrl"
  double learning_rate = 0.01;
  double momentum = 0.9;             // momentum
  bool nesterov = false;             // momentum
  double beta1 = 0.9;                // adam
  double beta2 = 0.999;              // adam
  double epsilon = 1e-7;             // adam, adagrad
  double initial_accumulator = 0.1;  // adagrad, ftrl
  double l1 = 0;                     // ftrl: L1 regularisation strength
  double l2 = 0;                     // ftrl: L2 regularisation strength
  // ftrl: TF's learning_rate_power, <= 0: the per-coordinate learning rate is
  // learning_rate / n^(-power) for n the squared-gradient sum (0: fixed rate).
  double learning_rate_power = -0.5;
};

struct TrainingSpec {
  TrainingMode mode = TrainingMode::kSync;
  // Sync: gradients averaged per step; 0 means "all workers".
  int replicas_to_aggregate = 0;
  // Async: a worker more than this many steps ahead of the slowest live worker
  // waits (bounded staleness). Unset = unbounded.
  std::optional<int64_t> max_staleness;
  ModelSpec model;
  std::string dataset_name = "fashion-mnist";
  std::string dataset_path = "/usr/share/datasets/fashion-mnist";  // format idx: the directory
  std::string dataset_format = "idx";                              // "idx" | "csv"
  TabularSpec tabular;                                             // format csv
  std::string dataset_yaml;        // the dataset section as written ("" if absent), for model files
  int64_t shuffle_buffer = 65536;  // records each worker's shuffle buffer holds (core/dataset.h)
  OptimizerSpec optimizer;
  // The wide part's tables (model.wide.optimizer); unset: `optimizer`.
  std::optional<OptimizerSpec> wide_optimizer;
  int batch_size = 100;  // per worker, per step
  // Exactly one of steps / epochs (validation enforces it).
  std::optional<int64_t> steps;
  std::optional<double> epochs;
  uint64_t seed = 1;
  int64_t eval_every_steps = 0;  // 0: evaluate only at the end
  std::string checkpoint_dir;    // empty: no checkpoints
  int64_t checkpoint_every_steps = 0;
  int64_t checkpoint_every_seconds = 0;
  int64_t split_threshold_bytes = 4
                                  << 20;  // variables above this are split by rows across PS tasks
  int64_t chunk_bytes = 1 << 20;          // max tensor payload per message
  int64_t startup_timeout_seconds = 300;  // how long a worker retries an unreachable PS
  double barrier_timeout_seconds =
      0;  // sync: proceed with what arrived after this; 0 = wait forever
};

struct TrainingJob {
  std::string name;
  std::string namespace_ = "default";
  // Keys: "PS", "Worker", and optionally "Chief", "Evaluator".
  std::map<std::string, ReplicaSpec> replica_specs;
  RunPolicy run_policy;
  std::string success_policy;  // "" (chief or worker 0) | "AllWorkers"
  TrainingSpec training;
  // False when spec.training is omitted, which is allowed only when every
  // replica's template names its own containers: the user's program (e.g. an
  // unmodified TensorFlow one) gets TF_CONFIG, Services and the lifecycle, and
  // no kubetrain runtime runs; `training` then holds unused defaults.
  bool has_training = true;

  int num_ps() const;
  int num_workers() const;
  // Every task of every replica type.
  int num_tasks() const;
  // The scheduler the job's pods go to: the schedulerName its templates name
  // (validation makes them agree when schedulingPolicy is set), "" if none.
  std::string scheduler_name() const;
  // Gang scheduling: the PodGroup's minMember (minAvailable, else every task).
  int min_available() const;
  bool has_chief_replica() const { return replica_specs.count("Chief") > 0; }
  // The task that does the chief's duties (evaluation, export, reporting,
  // ending the job): the Chief replica's task ("chief", 0) if the job has
  // one, else worker 0 ("worker", 0). TF_CONFIG task types are lower-case.
  std::string chief_task_type() const { return has_chief_replica() ? "chief" : "worker"; }
  bool IsChiefTask(const std::string& task_type, int task_index) const {
    return task_index == 0 && task_type == chief_task_type();
  }
  // replicas_to_aggregate with the default applied (all workers).
  int effective_replicas_to_aggregate() const;
  // Global steps to train: `steps`, or epochs converted with the dataset size:
  // ceil(epochs * train_examples / (batch_size * examples per global step)),
  // where a sync step consumes replicas_to_aggregate batches and an async step one.
  int64_t TargetSteps(int64_t train_examples) const;
};

// The largest TrainingJob accepted, as text: Kubernetes refuses objects over
// ~1.5 MiB (etcd's request limit), and every task parses the file again.
inline constexpr int64_t kMaxTrainingJobBytes = 1536 * 1024;

// Parses a YAML document holding one TrainingJob and validates it. Syntax
// errors give the line and column ("invalid YAML at line 4, column 9: ...",
// also for a quoted string that is never closed); text over
// kMaxTrainingJobBytes is refused before it is parsed.
absl::StatusOr<TrainingJob> ParseTrainingJob(const std::string& yaml_text);
// The same for a file; every message starts with the path. A directory "is a
// directory"; a file over kMaxTrainingJobBytes is refused before it is read
// whole.
absl::StatusOr<TrainingJob> LoadTrainingJobFile(const std::string& path);

// Cross-field validation (already applied by ParseTrainingJob).
absl::Status ValidateTrainingJob(const TrainingJob& job);

// Parses a spec.training.dataset section on its own (as recorded in a model
// file) into out's dataset fields; errors as ParseTrainingJob's.
absl::Status ParseDatasetSection(const std::string& yaml_text, TrainingSpec* out);

// The shortest decimal text that reads back as `value` (StrCat keeps 6
// digits, which would print 0.99999999999 as "1").
std::string ShortestDouble(double value);

const char* TrainingModeName(TrainingMode mode);
const char* RestartPolicyName(RestartPolicy policy);
// The policy named exactly as in a spec ("OnFailure"), or nullopt.
std::optional<RestartPolicy> RestartPolicyFromName(const std::string& name);

// Whether a task that exited with `exit_code` is started again (TFJob
// semantics): OnFailure/Always on any failure; ExitCode only for codes >= 128
// (killed by a signal: 137 SIGKILL/OOM, 143 SIGTERM), 1-127 being permanent
// errors; Never not at all. A task that exited 0 is done.
bool IsRetryable(RestartPolicy policy, int exit_code);

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_JOB_SPEC_H_
