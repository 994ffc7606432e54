#include "core/job_spec.h"
#include "core/yaml_limits_testing.h"

#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"

namespace kubetrain {
namespace {

// gtest only (gmock is not among the system deps).
#define EXPECT_STARTS_WITH(s, prefix)                    \
  do {                                                   \
    const std::string kt_s = (s);                        \
    EXPECT_TRUE(absl::StartsWith(kt_s, prefix)) << kt_s; \
  } while (0)
#define EXPECT_CONTAINS(s, part)                        \
  do {                                                  \
    const std::string kt_s = (s);                       \
    EXPECT_TRUE(absl::StrContains(kt_s, part)) << kt_s; \
  } while (0)

// Example specs are runfiles: relative to the cwd under `bazel test`, or
// under $TEST_SRCDIR/$TEST_WORKSPACE otherwise.
std::string ExamplePath(const std::string& name) {
  std::string relative = "examples/" + name;
  if (std::ifstream(relative).good()) return relative;
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir != nullptr) {
    return absl::StrCat(srcdir, "/", workspace != nullptr ? workspace : "kubetrain", "/", relative);
  }
  return relative;
}

// A valid spec; the malformed cases below each change one thing.
constexpr char kValid[] = R"(apiVersion: kubetrain.io/v1
kind: TrainingJob
metadata:
  name: test-job
  labels: {team: ml}
spec:
  replicaSpecs:
    PS:
      replicas: 2
      restartPolicy: OnFailure
    Worker:
      replicas: 3
      restartPolicy: ExitCode
      template:
        spec:
          containers:
          - name: tensorflow
            image: kubetrain:dev
  runPolicy:
    cleanPodPolicy: All
    ttlSecondsAfterFinished: 600
    activeDeadlineSeconds: 3600
    backoffLimit: 3
    suspend: false
  successPolicy: AllWorkers
  training:
    mode: sync
    replicasToAggregate: 2
    model:
      type: mlp
      hiddenUnits: [64]
    optimizer:
      type: momentum
      learningRate: 0.1
      momentum: 0.5
      nesterov: true
    batchSize: 32
    steps: 200
    seed: 42
    evaluation:
      everySteps: 50
    checkpoint:
      directory: /tmp/ckpt
      everySteps: 100
      everySeconds: 60
    placement:
      splitThresholdBytes: 8192
    transport:
      chunkBytes: 65536
    startupTimeoutSeconds: 30
    barrierTimeoutSeconds: 2.5
status:
  anything: ignored
)";

std::string Replace(const std::string& from, const std::string& to) {
  std::string s = kValid;
  size_t pos = s.find(from);
  EXPECT_NE(pos, std::string::npos) << "test bug: " << from;
  if (pos != std::string::npos) s.replace(pos, from.size(), to);
  return s;
}

// The error message for a spec that must be rejected.
std::string ErrorOf(const std::string& yaml) {
  absl::StatusOr<TrainingJob> job = ParseTrainingJob(yaml);
  if (job.ok()) return "<parsed OK>";
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument) << job.status();
  return std::string(job.status().message());
}

TEST(JobSpecTest, SyncExample) {
  absl::StatusOr<TrainingJob> job = LoadTrainingJobFile(ExamplePath("fashion-mnist-sync.yaml"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->name, "fashion-mnist-sync");
  EXPECT_EQ(job->namespace_, "default");
  EXPECT_EQ(job->num_ps(), 2);
  EXPECT_EQ(job->num_workers(), 2);
  EXPECT_EQ(job->replica_specs.at("PS").restart_policy, RestartPolicy::kOnFailure);
  EXPECT_EQ(job->run_policy.active_deadline_seconds, 1800);
  EXPECT_EQ(job->run_policy.backoff_limit, 3);
  EXPECT_EQ(job->run_policy.clean_pod_policy, "Running");
  EXPECT_EQ(job->training.mode, TrainingMode::kSync);
  EXPECT_EQ(job->training.replicas_to_aggregate, 2);
  EXPECT_EQ(job->effective_replicas_to_aggregate(), 2);
  EXPECT_EQ(job->training.model.type, "mlp");
  EXPECT_EQ(job->training.model.hidden_units, std::vector<int>({256, 128}));
  EXPECT_EQ(job->training.dataset_name, "fashion-mnist");
  EXPECT_EQ(job->training.dataset_path, "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(job->training.optimizer.type, "adam");
  EXPECT_DOUBLE_EQ(job->training.optimizer.learning_rate, 0.001);
  EXPECT_EQ(job->training.batch_size, 64);
  EXPECT_FALSE(job->training.steps.has_value());
  EXPECT_EQ(job->training.epochs, 8.0);
  EXPECT_EQ(job->training.seed, 7u);
  EXPECT_EQ(job->training.eval_every_steps, 500);
  // ceil(8 * 60000 / (64 * 2))
  EXPECT_EQ(job->TargetSteps(60000), 3750);
}

TEST(JobSpecTest, AsyncExample) {
  absl::StatusOr<TrainingJob> job = LoadTrainingJobFile(ExamplePath("fashion-mnist-async.yaml"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->name, "fashion-mnist-async");
  EXPECT_EQ(job->training.mode, TrainingMode::kAsync);
  EXPECT_EQ(job->training.max_staleness, 8);
  EXPECT_EQ(job->training.replicas_to_aggregate, 0);
  EXPECT_EQ(job->training.model.hidden_units, std::vector<int>({256, 128}));
  EXPECT_DOUBLE_EQ(job->training.optimizer.learning_rate, 0.0005);
  EXPECT_EQ(job->training.eval_every_steps, 1000);
  // Async: one batch per global step, ceil(8 * 60000 / 64).
  EXPECT_EQ(job->TargetSteps(60000), 7500);
}

TEST(JobSpecTest, SoftmaxSeedExample) {
  absl::StatusOr<TrainingJob> job = LoadTrainingJobFile(ExamplePath("softmax-seed.yaml"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->num_ps(), 1);
  EXPECT_EQ(job->num_workers(), 1);
  EXPECT_EQ(job->replica_specs.at("Worker").restart_policy, RestartPolicy::kNever);
  EXPECT_EQ(job->training.model.type, "softmax");
  EXPECT_TRUE(job->training.model.hidden_units.empty());
  EXPECT_EQ(job->training.optimizer.type, "sgd");
  EXPECT_DOUBLE_EQ(job->training.optimizer.learning_rate, 0.05);
  EXPECT_EQ(job->training.batch_size, 100);
  EXPECT_EQ(job->training.steps, 20000);
  EXPECT_EQ(job->TargetSteps(60000), 20000);
  EXPECT_EQ(job->effective_replicas_to_aggregate(), 1);
}

TEST(JobSpecTest, FullSpecParses) {
  absl::StatusOr<TrainingJob> job = ParseTrainingJob(kValid);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->num_workers(), 3);
  EXPECT_EQ(job->replica_specs.at("Worker").restart_policy, RestartPolicy::kExitCode);
  EXPECT_CONTAINS(job->replica_specs.at("Worker").template_yaml, "image: kubetrain:dev");
  EXPECT_TRUE(job->replica_specs.at("PS").template_yaml.empty());
  EXPECT_EQ(job->run_policy.clean_pod_policy, "All");
  EXPECT_EQ(job->run_policy.ttl_seconds_after_finished, 600);
  EXPECT_FALSE(job->run_policy.suspend);
  EXPECT_EQ(job->success_policy, "AllWorkers");
  EXPECT_EQ(job->training.optimizer.type, "momentum");
  EXPECT_DOUBLE_EQ(job->training.optimizer.momentum, 0.5);
  EXPECT_TRUE(job->training.optimizer.nesterov);
  EXPECT_EQ(job->training.checkpoint_dir, "/tmp/ckpt");
  EXPECT_EQ(job->training.checkpoint_every_steps, 100);
  EXPECT_EQ(job->training.checkpoint_every_seconds, 60);
  EXPECT_EQ(job->training.split_threshold_bytes, 8192);
  EXPECT_EQ(job->training.chunk_bytes, 65536);
  EXPECT_EQ(job->training.startup_timeout_seconds, 30);
  EXPECT_DOUBLE_EQ(job->training.barrier_timeout_seconds, 2.5);
  EXPECT_EQ(job->training.seed, 42u);
}

TEST(JobSpecTest, ReplicaTypesAreCaseInsensitive) {
  std::string yaml =
      Replace("  runPolicy:", "    evaluator:\n      replicas: 1\n    chief: {}\n  runPolicy:");
  yaml = absl::StrReplaceAll(yaml, {{"    PS:", "    ps:"}, {"    Worker:", "    worker:"}});
  absl::StatusOr<TrainingJob> job = ParseTrainingJob(yaml);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->replica_specs.size(), 4u);
  EXPECT_EQ(job->replica_specs.count("PS"), 1u);
  EXPECT_EQ(job->replica_specs.count("Worker"), 1u);
  EXPECT_EQ(job->replica_specs.count("Chief"), 1u);
  EXPECT_EQ(job->replica_specs.count("Evaluator"), 1u);
  EXPECT_EQ(job->num_ps(), 2);
  EXPECT_EQ(job->num_workers(), 3);
  EXPECT_EQ(job->replica_specs.at("Chief").replicas, 1);  // default
}

TEST(JobSpecTest, DuplicateReplicaTypeAfterNormalisation) {
  EXPECT_EQ(ErrorOf(Replace("    Worker:\n", "    worker: {}\n    Worker:\n")),
            "spec.replicaSpecs.Worker: duplicate replica type (keys are "
            "case-insensitive)");
}

TEST(JobSpecTest, Defaults) {
  absl::StatusOr<TrainingJob> job = ParseTrainingJob(R"(
apiVersion: kubetrain.io/v1
kind: TrainingJob
metadata: {name: minimal}
spec:
  replicaSpecs: {PS: {}, Worker: {replicas: 4}}
  training: {steps: 10}
)");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->num_ps(), 1);
  EXPECT_EQ(job->replica_specs.at("PS").restart_policy, RestartPolicy::kNever);
  EXPECT_EQ(job->training.mode, TrainingMode::kSync);
  EXPECT_EQ(job->effective_replicas_to_aggregate(), 4);
  EXPECT_EQ(job->training.model.type, "softmax");
  EXPECT_EQ(job->training.optimizer.type, "sgd");
  EXPECT_DOUBLE_EQ(job->training.optimizer.learning_rate, 0.01);
  EXPECT_EQ(job->training.batch_size, 100);
  EXPECT_EQ(job->training.seed, 1u);
  EXPECT_FALSE(job->run_policy.backoff_limit.has_value());
  EXPECT_FALSE(job->training.max_staleness.has_value());
}

TEST(JobSpecTest, TargetStepsFromEpochs) {
  TrainingJob job;
  job.replica_specs["PS"].replicas = 1;
  job.replica_specs["Worker"].replicas = 4;
  job.training.batch_size = 100;
  job.training.epochs = 1;
  EXPECT_EQ(job.TargetSteps(60000), 150);  // all 4 batches per step
  job.training.replicas_to_aggregate = 3;  // backup worker: 3 batches per step
  EXPECT_EQ(job.TargetSteps(60000), 200);
  job.training.epochs = 0.1;  // inexact in binary; must not round up to 21
  EXPECT_EQ(job.TargetSteps(60000), 20);
  job.training.epochs = 0.0001;
  EXPECT_EQ(job.TargetSteps(60000), 1);  // at least one step
  job.training.mode = TrainingMode::kAsync;
  job.training.replicas_to_aggregate = 0;
  job.training.epochs = 2.5;
  EXPECT_EQ(job.TargetSteps(60000), 1500);
  job.training.steps = 77;
  job.training.epochs.reset();
  EXPECT_EQ(job.TargetSteps(60000), 77);
}

TEST(JobSpecTest, Names) {
  EXPECT_STREQ(TrainingModeName(TrainingMode::kSync), "sync");
  EXPECT_STREQ(TrainingModeName(TrainingMode::kAsync), "async");
  EXPECT_STREQ(RestartPolicyName(RestartPolicy::kNever), "Never");
  EXPECT_STREQ(RestartPolicyName(RestartPolicy::kOnFailure), "OnFailure");
  EXPECT_STREQ(RestartPolicyName(RestartPolicy::kAlways), "Always");
  EXPECT_STREQ(RestartPolicyName(RestartPolicy::kExitCode), "ExitCode");
  for (auto policy : {RestartPolicy::kNever, RestartPolicy::kOnFailure, RestartPolicy::kAlways,
                      RestartPolicy::kExitCode}) {
    EXPECT_EQ(RestartPolicyFromName(RestartPolicyName(policy)), policy);
  }
  EXPECT_EQ(RestartPolicyFromName("onfailure"), std::nullopt);
}

TEST(JobSpecTest, MissingFileNamesIt) {
  absl::StatusOr<TrainingJob> job = LoadTrainingJobFile("no/such/trainingjob.yaml");
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().message(),
            "cannot read no/such/trainingjob.yaml: No such file or directory");
}

TEST(JobSpecTest, FileParseErrorsArePrefixedWithTheFileName) {
  std::string path = absl::StrCat(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp",
                                  "/bad-trainingjob.yaml");
  std::ofstream(path) << Replace("mode: sync", "mode: fast");
  absl::StatusOr<TrainingJob> job = LoadTrainingJobFile(path);
  ASSERT_FALSE(job.ok());
  EXPECT_STARTS_WITH(std::string(job.status().message()),
                     (path + ": spec.training.mode: must be one of sync, async"));
}

TEST(JobSpecTest, ADirectoryIsNamedAsOne) {
  const std::string dir = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  absl::StatusOr<TrainingJob> job = LoadTrainingJobFile(dir);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(job.status().message(), dir + ": is a directory, expected a TrainingJob YAML file");
}

TEST(JobSpecTest, FilesOverTheKubernetesObjectLimitAreRefusedBeforeParsing) {
  std::string path = absl::StrCat(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp",
                                  "/huge-trainingjob.yaml");
  // Valid YAML, padded with a comment past the limit.
  std::string text = std::string(kValid) + "# " + std::string(kMaxTrainingJobBytes, 'x') + "\n";
  std::ofstream(path) << text;
  absl::StatusOr<TrainingJob> job = LoadTrainingJobFile(path);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().message(),
            absl::StrCat(path, ": is ", text.size(),
                         " bytes; a TrainingJob may be at most 1572864 bytes (1.5 MiB, the size "
                         "Kubernetes allows an object)"));
  EXPECT_STARTS_WITH(ErrorOf(text), absl::StrCat("is ", text.size(), " bytes; a TrainingJob"));
  // Through a pipe (no size up front) the reader stops at the limit.
  const std::string fifo = path + ".fifo";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::thread writer([&] {
    std::ofstream out(fifo);
    out << text << text;  // stops when the reader closes its end (SIGPIPE is ignored below)
  });
  std::signal(SIGPIPE, SIG_IGN);
  job = LoadTrainingJobFile(fifo);
  writer.join();
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().message(),
            absl::StrCat(fifo,
                         ": is more than 1572864 bytes; a TrainingJob may be at most 1.5 MiB (the "
                         "size Kubernetes allows an object)"));
  // Just under the limit is parsed.
  std::string fits = std::string(kValid) + "# " +
                     std::string(kMaxTrainingJobBytes - std::string(kValid).size() - 3, 'x') + "\n";
  ASSERT_EQ(static_cast<int64_t>(fits.size()), kMaxTrainingJobBytes);
  EXPECT_EQ(ErrorOf(fits), "<parsed OK>");
}

TEST(JobSpecErrors, AnUnterminatedQuoteGivesLineAndColumn) {
  EXPECT_EQ(ErrorOf(Replace("name: test-job", "name: \"test-job")),
            "invalid YAML at line 4, column 9: unterminated quoted string (no closing \" before "
            "the end)");
  EXPECT_EQ(ErrorOf(Replace("image: kubetrain:dev", "image: 'kubetrain:dev")),
            "invalid YAML at line 18, column 20: unterminated quoted string (no closing ' before "
            "the end)");
  // Closed quotes with escapes inside are fine.
  EXPECT_EQ(ErrorOf(Replace("image: kubetrain:dev", "image: \"kube\\\"train\\\\\"")),
            "<parsed OK>");
  EXPECT_EQ(ErrorOf(Replace("image: kubetrain:dev", "image: 'it''s'")), "<parsed OK>");
}

std::string BombError(int line, int column) {
  return absl::StrCat("invalid YAML at line ", line, ", column ", column,
                      ": alias *a4 would expand the document past 100000 nodes (aliases of "
                      "aliases multiply: an alias bomb)");
}

// Free-form maps (labels, annotations, a pod template, status) are not read
// field by field, but the whole tree was walked once (the quote check) and
// this took hours; it must be refused before any walk.
TEST(JobSpecErrors, AnAliasBombIsRefusedWherever) {
  EXPECT_EQ(ErrorOf(Replace("  labels: {team: ml}\n", "  labels:\n" + AliasBomb(4))),
            BombError(11, 29));
  EXPECT_EQ(ErrorOf(Replace("  labels: {team: ml}\n",
                            "  labels: {team: ml}\n  annotations:\n" + AliasBomb(4))),
            BombError(12, 29));
  EXPECT_EQ(
      ErrorOf(Replace("      template:\n", "      template:\n        metadata:\n" + AliasBomb(10))),
      BombError(21, 35));
  EXPECT_EQ(ErrorOf(Replace("status:\n  anything: ignored\n", "status:\n" + AliasBomb(2))),
            BombError(58, 27));
}

TEST(JobSpecErrors, AnAliasInsideItsOwnNodeIsRefused) {
  // yaml-cpp builds a tree that contains itself: the walk overflowed the stack.
  EXPECT_EQ(ErrorOf(Replace("  labels: {team: ml}\n", "  labels: &l {team: [*l]}\n")),
            "invalid YAML at line 5, column 22: alias *l is inside the node it names (a structure "
            "that contains itself has no end)");
}

TEST(JobSpecTest, AnchorsAndAliasesAsJobsUseThemParse) {
  // One pod template shared by Chief, PS and Worker.
  absl::StatusOr<TrainingJob> job = LoadTrainingJobFile(ExamplePath("tensorflow/ps-strategy.yaml"));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->replica_specs.size(), 3u);
  const std::string& chief = job->replica_specs.at("Chief").template_yaml;
  EXPECT_CONTAINS(chief, "image: tensorflow/tensorflow:");
  EXPECT_EQ(job->replica_specs.at("PS").template_yaml, chief);
  EXPECT_EQ(job->replica_specs.at("Worker").template_yaml, chief);
  // A scalar alias too.
  EXPECT_EQ(ErrorOf(Replace("  labels: {team: ml}\n", "  labels: {team: &t ml, owner: *t}\n")),
            "<parsed OK>");
}

TEST(JobSpecErrors, AnAliasBombInADatasetSectionIsRefused) {
  // The section comes back from a model file (kubetrain eval).
  TrainingSpec training;
  const absl::Status status =
      ParseDatasetSection("name: fashion-mnist\n" + AliasBomb(0), &training);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(status.message()),
            absl::StrCat("spec.training.dataset: ", BombError(7, 25)));
}

// ---- Malformed specs: each error names the offending field. ----

TEST(JobSpecErrors, MissingWorker) {
  std::string yaml = Replace("    Worker:\n      replicas: 3\n      restartPolicy: ExitCode\n", "");
  yaml = absl::StrReplaceAll(yaml,
                             {{"      template:\n        spec:\n          containers:\n"
                               "          - name: tensorflow\n            image: kubetrain:dev\n",
                               ""}});
  EXPECT_EQ(ErrorOf(yaml), "spec.replicaSpecs.Worker: required");
}

TEST(JobSpecErrors, MissingReplicaSpecs) {
  EXPECT_EQ(ErrorOf(R"(
apiVersion: kubetrain.io/v1
kind: TrainingJob
metadata: {name: x}
spec: {training: {steps: 1}}
)"),
            "spec.replicaSpecs: required");
}

TEST(JobSpecErrors, NegativeReplicas) {
  EXPECT_EQ(ErrorOf(Replace("replicas: 3", "replicas: -1")),
            "spec.replicaSpecs.Worker.replicas: must be in [1, 1000], got -1");
}

TEST(JobSpecErrors, HugeReplicas) {
  EXPECT_EQ(ErrorOf(Replace("replicas: 2", "replicas: 100000")),
            "spec.replicaSpecs.PS.replicas: must be in [1, 1000], got 100000");
  EXPECT_EQ(ErrorOf(Replace("replicas: 2", "replicas: 99999999999999999999999")),
            "spec.replicaSpecs.PS.replicas: out of range, got "
            "99999999999999999999999");
}

TEST(JobSpecErrors, ReplicasNotAnInteger) {
  EXPECT_EQ(ErrorOf(Replace("replicas: 3", "replicas: two")),
            "spec.replicaSpecs.Worker.replicas: expected an integer, got \"two\"");
  EXPECT_EQ(ErrorOf(Replace("replicas: 3", "replicas: 1.5")),
            "spec.replicaSpecs.Worker.replicas: expected an integer, got \"1.5\"");
  // Quoted numbers are strings, as in Kubernetes.
  EXPECT_EQ(ErrorOf(Replace("replicas: 3", "replicas: \"3\"")),
            "spec.replicaSpecs.Worker.replicas: expected an integer, got \"3\"");
  EXPECT_EQ(ErrorOf(Replace("replicas: 3", "replicas: [3]")),
            "spec.replicaSpecs.Worker.replicas: expected an integer, got a list");
}

TEST(JobSpecErrors, OtherTypeErrors) {
  EXPECT_EQ(ErrorOf(Replace("hiddenUnits: [64]", "hiddenUnits: {a: 64}")),
            "spec.training.model.hiddenUnits: expected a list of integers, got "
            "a mapping");
  EXPECT_EQ(ErrorOf(Replace("hiddenUnits: [64]", "hiddenUnits: [64, x]")),
            "spec.training.model.hiddenUnits[1]: expected an integer, got \"x\"");
  EXPECT_EQ(ErrorOf(Replace("seed: 42", "seed: -3")), "spec.training.seed: must be >= 0, got -3");
  EXPECT_EQ(ErrorOf(Replace("suspend: false", "suspend: maybe")),
            "spec.runPolicy.suspend: expected true or false, got \"maybe\"");
  EXPECT_EQ(ErrorOf(Replace("learningRate: 0.1", "learningRate: fast")),
            "spec.training.optimizer.learningRate: expected a number, got \"fast\"");
  EXPECT_EQ(
      ErrorOf(Replace("  successPolicy: AllWorkers", "  successPolicy: AllWorkers\n  unused: 1")),
      "spec.unused: unknown field (known: replicaSpecs, runPolicy, "
      "successPolicy, training)");
}

TEST(JobSpecErrors, UnknownMode) {
  EXPECT_EQ(ErrorOf(Replace("mode: sync", "mode: hogwild")),
            "spec.training.mode: must be one of sync, async, got \"hogwild\"");
}

TEST(JobSpecErrors, ReplicasToAggregateAboveWorkers) {
  EXPECT_EQ(ErrorOf(Replace("replicasToAggregate: 2", "replicasToAggregate: 4")),
            "spec.training.replicasToAggregate: must be in [1, 3] (the number of "
            "Worker replicas), "
            "got 4");
  EXPECT_EQ(ErrorOf(Replace("replicasToAggregate: 2", "replicasToAggregate: 0")),
            "spec.training.replicasToAggregate: must be >= 1, got 0");
}

TEST(JobSpecErrors, ReplicasToAggregateWithAsync) {
  EXPECT_EQ(ErrorOf(Replace("mode: sync", "mode: async")),
            "spec.training.replicasToAggregate: only applies to mode sync");
}

TEST(JobSpecErrors, MaxStalenessInSync) {
  EXPECT_EQ(ErrorOf(Replace("mode: sync", "mode: sync\n    maxStaleness: 4")),
            "spec.training.maxStaleness: only applies to mode async");
  EXPECT_EQ(ErrorOf(Replace("    mode: sync\n    replicasToAggregate: 2\n",
                            "    mode: async\n    maxStaleness: -1\n")),
            "spec.training.maxStaleness: must be >= 0, got -1");
}

TEST(JobSpecErrors, StepsAndEpochs) {
  EXPECT_EQ(ErrorOf(Replace("steps: 200", "steps: 200\n    epochs: 2")),
            "spec.training.epochs: cannot be set together with steps (set "
            "exactly one)");
  EXPECT_EQ(ErrorOf(Replace("    steps: 200\n", "")),
            "spec.training: one of steps or epochs is required");
  EXPECT_EQ(ErrorOf(Replace("steps: 200", "steps: 0")), "spec.training.steps: must be >= 1, got 0");
  EXPECT_EQ(ErrorOf(Replace("steps: 200", "epochs: .inf")),
            "spec.training.epochs: must be a finite number, got inf");
}

TEST(JobSpecErrors, UnknownFieldTypo) {
  EXPECT_EQ(ErrorOf(Replace("    optimizer:", "    optimiser:")),
            "spec.training.optimiser: unknown field (known: mode, "
            "replicasToAggregate, maxStaleness, "
            "model, dataset, optimizer, batchSize, steps, epochs, seed, "
            "evaluation, checkpoint, "
            "placement, transport, startupTimeoutSeconds, "
            "barrierTimeoutSeconds); did you mean "
            "\"optimizer\"?");
  EXPECT_STARTS_WITH(ErrorOf(Replace("learningRate: 0.1", "learning_rate: 0.1")),
                     ("spec.training.optimizer.learning_rate: unknown field"));
  EXPECT_STARTS_WITH(ErrorOf(Replace("replicas: 2", "replica: 2")),
                     ("spec.replicaSpecs.PS.replica: unknown field (known: replicas, "
                      "restartPolicy, template)"));
  EXPECT_EQ(ErrorOf(Replace("status:", "extra: 1\nstatus:")),
            "extra: unknown field (known: apiVersion, kind, metadata, spec, status)");
}

TEST(JobSpecErrors, LearningRateNotPositive) {
  EXPECT_EQ(ErrorOf(Replace("learningRate: 0.1", "learningRate: 0")),
            "spec.training.optimizer.learningRate: must be > 0, got 0");
  EXPECT_EQ(ErrorOf(Replace("learningRate: 0.1", "learningRate: -1")),
            "spec.training.optimizer.learningRate: must be > 0, got -1");
  EXPECT_EQ(ErrorOf(Replace("learningRate: 0.1", "learningRate: .nan")),
            "spec.training.optimizer.learningRate: must be a finite number, got nan");
}

TEST(JobSpecErrors, HyperParametersMustFitFloat32) {
  EXPECT_EQ(ErrorOf(Replace("learningRate: 0.1", "learningRate: 1e39")),
            "spec.training.optimizer.learningRate: must be at most 3.40282e+38 in magnitude (it "
            "is used as a float32), got 1e+39");
  EXPECT_STARTS_WITH(ErrorOf(Replace("learningRate: 0.1", "learningRate: 1e-40")),
                     "spec.training.optimizer.learningRate: must be 0 or at least 1.17549e-38");
  EXPECT_EQ(ErrorOf(Replace("momentum: 0.5", "momentum: 0.99999999999")),
            "spec.training.optimizer.momentum: must be < 1 as a float32 (0.99999999999 rounds to "
            "1), got 0.99999999999");
  const std::string adam = "type: adam\n      learningRate: 0.1\n";
  auto with_adam = [&](const std::string& extra) {
    return Replace(
        "type: momentum\n      learningRate: 0.1\n      momentum: 0.5\n      "
        "nesterov: true\n",
        adam + extra);
  };
  EXPECT_STARTS_WITH(ErrorOf(with_adam("      epsilon: 1e-50\n")),
                     "spec.training.optimizer.epsilon: must be 0 or at least 1.17549e-38 in "
                     "magnitude (it is used as a float32");
  EXPECT_EQ(ErrorOf(with_adam("      beta2: 0.99999999999\n")),
            "spec.training.optimizer.beta2: must be < 1 as a float32 (0.99999999999 rounds to 1), "
            "got 0.99999999999");
  // The edges of the range are fine.
  EXPECT_EQ(ErrorOf(Replace("learningRate: 0.1", "learningRate: 3e38")), "<parsed OK>");
  EXPECT_EQ(ErrorOf(with_adam("      epsilon: 1e-37\n")), "<parsed OK>");
}

TEST(JobSpecErrors, OptimizerFields) {
  EXPECT_EQ(ErrorOf(Replace("momentum: 0.5", "momentum: 1")),
            "spec.training.optimizer.momentum: must be in [0, 1), got 1");
  EXPECT_EQ(ErrorOf(Replace("type: momentum", "type: sgd")),
            "spec.training.optimizer.momentum: only applies to type momentum, "
            "but type is sgd");
  EXPECT_EQ(ErrorOf(Replace("type: momentum", "type: rmsprop")),
            "spec.training.optimizer.type: must be one of sgd, momentum, adam, "
            "adagrad, ftrl, got "
            "\"rmsprop\"");
}

// TF's learning_rate_power for ftrl: default -0.5, <= 0 (0: a fixed rate),
// and only for ftrl.
TEST(JobSpecErrors, FtrlLearningRatePower) {
  const std::string momentum =
      "type: momentum\n      learningRate: 0.1\n      momentum: 0.5\n      nesterov: true\n";
  auto ftrl = [&](const std::string& extra) {
    return Replace(momentum, "type: ftrl\n      learningRate: 0.1\n" + extra);
  };
  absl::StatusOr<TrainingJob> job = ParseTrainingJob(ftrl(""));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->training.optimizer.learning_rate_power, -0.5);
  job = ParseTrainingJob(ftrl("      learningRatePower: -0.25\n"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->training.optimizer.learning_rate_power, -0.25);
  EXPECT_EQ(ErrorOf(ftrl("      learningRatePower: 0\n")), "<parsed OK>");
  EXPECT_EQ(ErrorOf(ftrl("      learningRatePower: 0.5\n")),
            "spec.training.optimizer.learningRatePower: must be <= 0, got 0.5");
  EXPECT_EQ(ErrorOf(ftrl("      learningRatePower: .nan\n")),
            "spec.training.optimizer.learningRatePower: must be a finite number, got nan");
  EXPECT_STARTS_WITH(ErrorOf(ftrl("      learningRatePower: -1e-50\n")),
                     "spec.training.optimizer.learningRatePower: must be 0 or at least");
  EXPECT_EQ(ErrorOf(Replace(momentum, "type: adagrad\n      learningRatePower: -0.5\n")),
            "spec.training.optimizer.learningRatePower: only applies to type ftrl, but type is "
            "adagrad");
}

TEST(JobSpecErrors, BadRestartPolicy) {
  EXPECT_EQ(ErrorOf(Replace("restartPolicy: OnFailure", "restartPolicy: Sometimes")),
            "spec.replicaSpecs.PS.restartPolicy: must be one of Never, OnFailure, "
            "Always, ExitCode, "
            "got \"Sometimes\"");
  EXPECT_EQ(ErrorOf(Replace("restartPolicy: OnFailure", "restartPolicy: onfailure")),
            "spec.replicaSpecs.PS.restartPolicy: must be one of Never, OnFailure, "
            "Always, ExitCode, "
            "got \"onfailure\"; did you mean \"OnFailure\"?");
}

TEST(JobSpecErrors, BadApiVersionAndKind) {
  EXPECT_EQ(ErrorOf(Replace("kubetrain.io/v1", "kubeflow.org/v1")),
            "apiVersion: must be \"kubetrain.io/v1\", got \"kubeflow.org/v1\"");
  EXPECT_EQ(ErrorOf(Replace("kind: TrainingJob", "kind: TFJob")),
            "kind: must be \"TrainingJob\", got \"TFJob\"");
  EXPECT_EQ(ErrorOf(Replace("apiVersion: kubetrain.io/v1\n", "")), "apiVersion: required");
}

TEST(JobSpecErrors, BadName) {
  EXPECT_STARTS_WITH(ErrorOf(Replace("name: test-job", "name: Test-Job")),
                     ("metadata.name: must be a DNS-1035 label"));
  EXPECT_STARTS_WITH(ErrorOf(Replace("name: test-job", "name: 1job")),
                     ("metadata.name: must be a DNS-1035 label"));
  EXPECT_STARTS_WITH(ErrorOf(Replace("name: test-job", "name: job-")),
                     ("metadata.name: must be a DNS-1035 label"));
  EXPECT_STARTS_WITH(ErrorOf(Replace("name: test-job", "name: " + std::string(49, 'a'))),
                     ("metadata.name: must be at most 48 characters"));
  EXPECT_STARTS_WITH(ErrorOf(Replace("name: test-job", "name: " + std::string(64, 'a'))),
                     ("metadata.name: must be a DNS-1035 label"));
  EXPECT_TRUE(ParseTrainingJob(Replace("name: test-job", "name: " + std::string(48, 'a'))).ok());
  EXPECT_EQ(ErrorOf(Replace("  name: test-job\n", "  generateName: x-\n")),
            "metadata.name: required");
  EXPECT_STARTS_WITH(ErrorOf(Replace("name: test-job", "name: test-job\n  namespace: My_NS")),
                     ("metadata.namespace: must be a DNS-1123 label"));
}

TEST(JobSpecErrors, ChiefAndEvaluatorReplicas) {
  EXPECT_EQ(ErrorOf(Replace("  runPolicy:", "    Chief:\n      replicas: 2\n  runPolicy:")),
            "spec.replicaSpecs.Chief.replicas: must be 1, got 2");
  EXPECT_EQ(ErrorOf(Replace("  runPolicy:", "    Evaluator:\n      replicas: 0\n  runPolicy:")),
            "spec.replicaSpecs.Evaluator.replicas: must be 1, got 0");
}

TEST(JobSpecErrors, UnknownReplicaType) {
  EXPECT_EQ(ErrorOf(Replace("  runPolicy:", "    Launcher:\n      replicas: 1\n  runPolicy:")),
            "spec.replicaSpecs.Launcher: unknown replica type (known: PS, "
            "Worker, Chief, Evaluator)");
  EXPECT_EQ(ErrorOf(Replace("  runPolicy:", "    Master: {}\n  runPolicy:")),
            "spec.replicaSpecs.Master: unknown replica type (known: PS, "
            "Worker, Chief, Evaluator); "
            "use Chief");
}

TEST(JobSpecErrors, YamlSyntaxError) {
  std::string error = ErrorOf(Replace("hiddenUnits: [64]", "hiddenUnits: [64"));
  EXPECT_STARTS_WITH(error, ("invalid YAML at line "));
  EXPECT_CONTAINS(error, "column");
  EXPECT_EQ(ErrorOf("a: b: c\n"), "invalid YAML at line 1, column 5: illegal map value");
}

TEST(JobSpecErrors, NotATrainingJobDocument) {
  EXPECT_EQ(ErrorOf(""), "empty document, expected a TrainingJob");
  EXPECT_EQ(ErrorOf("# only a comment\n"), "empty document, expected a TrainingJob");
  EXPECT_EQ(ErrorOf("- a\n- b\n"), "expected a TrainingJob mapping at the top level, got a list");
  EXPECT_EQ(ErrorOf("hello\n"), "expected a TrainingJob mapping at the top level, got \"hello\"");
  EXPECT_EQ(ErrorOf(std::string(kValid) + "---\n" + kValid), "expected one YAML document, got 2");
  EXPECT_EQ(ErrorOf(Replace("  training:\n", "  training:\n  training:\n")),
            "spec.training: duplicate key");
}

TEST(JobSpecErrors, HiddenUnitsForSoftmax) {
  EXPECT_EQ(ErrorOf(Replace("type: mlp", "type: softmax")),
            "spec.training.model.hiddenUnits: must be empty for type softmax "
            "(a single 784 -> 10 "
            "layer)");
}

TEST(JobSpecErrors, EmptyMlpHiddenUnits) {
  EXPECT_EQ(ErrorOf(Replace("hiddenUnits: [64]", "hiddenUnits: []")),
            "spec.training.model.hiddenUnits: required for type mlp (at least "
            "one hidden layer)");
  EXPECT_EQ(ErrorOf(Replace("hiddenUnits: [64]", "hiddenUnits: [64, 0]")),
            "spec.training.model.hiddenUnits[1]: must be in [1, 65536], got 0");
  EXPECT_EQ(ErrorOf(Replace("hiddenUnits: [64]", "hiddenUnits: [100000]")),
            "spec.training.model.hiddenUnits[0]: must be in [1, 65536], got 100000");
  EXPECT_EQ(ErrorOf(Replace("type: mlp", "type: cnn")),
            "spec.training.model.type: must be one of softmax, mlp, layers, got \"cnn\"");
}

// The model section replaced by a layer list.
std::string WithLayers(const std::string& layers, const std::string& extra = "") {
  return Replace("      type: mlp\n      hiddenUnits: [64]\n", "      layers:\n" + layers + extra);
}

constexpr char kCnn[] =
    R"(      - {type: conv2d, filters: 8, kernel: 3, padding: same, activation: relu}
      - {type: maxpool2d, size: 2}
      - {type: conv2d, filters: 16, kernel: 3, stride: 2, activation: tanh}
      - {type: avgpool2d, size: 2, stride: 1}
      - {type: flatten}
      - {type: dropout, rate: 0.25}
      - {type: dense, units: 10}
)";

TEST(JobSpecLayers, ParsesEveryLayerKind) {
  auto job = ParseTrainingJob(WithLayers(kCnn));
  ASSERT_TRUE(job.ok()) << job.status();
  const ModelSpec& m = job->training.model;
  EXPECT_EQ(m.type, "layers");
  EXPECT_EQ(m.input_shape, (Shape{28, 28, 1}));
  ASSERT_EQ(m.layers.size(), 7u);
  EXPECT_EQ(m.layers[0].type, LayerType::kConv2D);
  EXPECT_EQ(m.layers[0].filters, 8);
  EXPECT_TRUE(m.layers[0].same_padding);
  EXPECT_EQ(m.layers[0].activation, Activation::kRelu);
  EXPECT_EQ(m.layers[1].type, LayerType::kMaxPool2D);
  EXPECT_EQ(m.layers[1].kernel, 2);
  EXPECT_EQ(m.layers[1].stride, 2);  // defaults to the size
  EXPECT_EQ(m.layers[2].stride, 2);
  EXPECT_FALSE(m.layers[2].same_padding);  // valid is the default
  EXPECT_EQ(m.layers[3].stride, 1);
  EXPECT_EQ(m.layers[5].rate, 0.25);
  EXPECT_EQ(m.layers[6].activation, Activation::kLinear);
  EXPECT_EQ(m.head, HeadType::kSoftmax);
  auto model = Model::Create(m);
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(model->variables()[2].name, "layers.2.kernel");
}

TEST(JobSpecLayers, ErrorsNameTheLayerField) {
  EXPECT_EQ(ErrorOf(WithLayers("      - {type: flatten}\n"
                               "      - {type: dense, units: 32}\n"
                               "      - {type: conv2d, filters: 4, kernel: 3}\n"
                               "      - {type: dense, units: 10}\n")),
            "spec.training.model.layers[2]: conv2d needs a 3-D input, got [32]");
  EXPECT_EQ(ErrorOf(WithLayers("      - {type: dense, units: 10}\n")),
            "spec.training.model.layers[0]: dense needs a 1-D input, got [28, 28, 1] (add a "
            "flatten layer before it)");
  EXPECT_EQ(ErrorOf(WithLayers("      - {type: flatten}\n      - {type: dense, units: 3}\n")),
            "spec.training.model.layers[1]: dense has 3 units, the softmax head needs 10: one "
            "unit per class of the labels (10)");
  EXPECT_EQ(ErrorOf(WithLayers("      - {type: dense, unit: 3}\n")),
            "spec.training.model.layers[0].unit: unknown field (known: type, units, activation); "
            "did you mean \"units\"?");
  EXPECT_EQ(ErrorOf(WithLayers("      - {type: conv2d, filters: 3}\n")),
            "spec.training.model.layers[0].kernel: required for conv2d");
  EXPECT_EQ(ErrorOf(WithLayers("      - {type: conv2d, filters: 3, kernel: 3, padding: full}\n")),
            "spec.training.model.layers[0].padding: must be one of same, valid, got \"full\"");
  EXPECT_EQ(ErrorOf(WithLayers("      - {type: dense, units: 3, activation: gelu}\n")),
            "spec.training.model.layers[0].activation: must be one of relu, tanh, sigmoid, "
            "linear, got \"gelu\"; did you mean \"relu\"?");
  EXPECT_EQ(ErrorOf(WithLayers("      - {type: dropout, rate: 1.5}\n")),
            "spec.training.model.layers[0].rate: must be in [0, 1), got 1.5");
  EXPECT_EQ(ErrorOf(WithLayers("      - {type: lstm}\n")),
            "spec.training.model.layers[0].type: must be one of dense, conv2d, maxpool2d, "
            "avgpool2d, flatten, dropout, got \"lstm\"");
  EXPECT_EQ(ErrorOf(WithLayers("      - {units: 3}\n")),
            "spec.training.model.layers[0].type: required");
  EXPECT_EQ(ErrorOf(WithLayers("      []\n")),
            "spec.training.model.layers: needs at least one layer");
  EXPECT_EQ(ErrorOf(Replace("      hiddenUnits: [64]\n",
                            "      hiddenUnits: [64]\n      layers: [{type: flatten}]\n")),
            "spec.training.model.layers: cannot be set with type \"mlp\" (a layer list is type "
            "\"layers\"; omit type)");
  EXPECT_EQ(ErrorOf(Replace("      hiddenUnits: [64]\n",
                            "      hiddenUnits: [64]\n      head: sigmoid\n")),
            "spec.training.model.head: only applies to a layer list (model.layers)");
  EXPECT_EQ(ErrorOf(WithLayers("      - {type: flatten}\n      - {type: dense, units: 10}\n",
                               "      head: hinge\n")),
            "spec.training.model.head: must be one of softmax, sigmoid, meanSquaredError, "
            "wideAndDeep, got "
            "\"hinge\"");
}

TEST(JobSpecErrors, RangesOfOtherFields) {
  EXPECT_EQ(ErrorOf(Replace("batchSize: 32", "batchSize: 0")),
            "spec.training.batchSize: must be in [1, 65536], got 0");
  EXPECT_EQ(ErrorOf(Replace("chunkBytes: 65536", "chunkBytes: 1024")),
            "spec.training.transport.chunkBytes: must be in [4096, 67108864], "
            "got 1024");
  EXPECT_EQ(ErrorOf(Replace("splitThresholdBytes: 8192", "splitThresholdBytes: 100")),
            "spec.training.placement.splitThresholdBytes: must be >= 4096, got 100");
  EXPECT_EQ(ErrorOf(Replace("startupTimeoutSeconds: 30", "startupTimeoutSeconds: 0")),
            "spec.training.startupTimeoutSeconds: must be >= 1, got 0");
  EXPECT_EQ(ErrorOf(Replace("barrierTimeoutSeconds: 2.5", "barrierTimeoutSeconds: -1")),
            "spec.training.barrierTimeoutSeconds: must be >= 0, got -1");
  EXPECT_EQ(ErrorOf(Replace("activeDeadlineSeconds: 3600", "activeDeadlineSeconds: 0")),
            "spec.runPolicy.activeDeadlineSeconds: must be >= 1, got 0");
  EXPECT_EQ(ErrorOf(Replace("backoffLimit: 3", "backoffLimit: -1")),
            "spec.runPolicy.backoffLimit: must be >= 0, got -1");
  EXPECT_EQ(ErrorOf(Replace("cleanPodPolicy: All", "cleanPodPolicy: Some")),
            "spec.runPolicy.cleanPodPolicy: must be one of All, Running, None, "
            "got \"Some\"");
  EXPECT_EQ(ErrorOf(Replace("successPolicy: AllWorkers", "successPolicy: Chief")),
            "spec.successPolicy: must be \"\" or \"AllWorkers\", got \"Chief\"");
  EXPECT_EQ(ErrorOf(Replace("      directory: /tmp/ckpt\n", "")),
            "spec.training.checkpoint.directory: required when everySteps or "
            "everySeconds is set");
  EXPECT_EQ(
      ErrorOf(Replace("    optimizer:", "    dataset: {name: cifar10, path: /d}\n    optimizer:")),
      "spec.training.dataset.name: must be one of fashion-mnist, mnist, "
      "got \"cifar10\"");
  EXPECT_EQ(ErrorOf(Replace("    optimizer:", "    dataset: {name: mnist}\n    optimizer:")),
            "spec.training.dataset.path: required for dataset \"mnist\"");
}

// format libsvm: the fields, their defaults, the model connection and every error.
std::string Libsvm(const std::string& fields, const std::string& model = "type: softmax") {
  return Replace("    model:\n      type: mlp\n      hiddenUnits: [64]\n    optimizer:",
                 "    model: {" + model + "}\n    dataset: {format: libsvm, trainFiles: [a.svm], " +
                     "testPath: t.svm" + fields + "}\n    optimizer:");
}

TEST(JobSpecTest, LibsvmDataset) {
  auto job = ParseTrainingJob(Libsvm(", numFeatures: 123"));
  ASSERT_TRUE(job.ok()) << job.status();
  const TabularSpec& t = job->training.tabular;
  EXPECT_EQ(job->training.dataset_format, "libsvm");
  EXPECT_TRUE(t.libsvm);
  EXPECT_EQ(t.num_features, 123);
  EXPECT_EQ(t.index_base, 1);
  EXPECT_EQ(t.libsvm_labels, LibsvmLabels::kBinary);
  EXPECT_EQ(t.train_files, (std::vector<std::string>{"a.svm"}));
  EXPECT_EQ(t.test_files, (std::vector<std::string>{"t.svm"}));
  EXPECT_EQ(job->training.model.input_dim, 123);
  EXPECT_EQ(job->training.model.num_classes, 2);
  job =
      ParseTrainingJob(Libsvm(", numFeatures: 8, indexBase: 0, labels: classes, numClasses: 7, "
                              "onBadRecord: skip"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->training.tabular.index_base, 0);
  EXPECT_EQ(job->training.model.num_classes, 7);
  EXPECT_TRUE(job->training.tabular.skip_bad_records);
  job = ParseTrainingJob(Libsvm(", numFeatures: 8, labels: regression",
                                "layers: [{type: dense, units: 1}], head: meanSquaredError"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->training.model.num_classes, 0);
  EXPECT_EQ(job->training.shuffle_buffer, 65536);
  job = ParseTrainingJob(Libsvm(", numFeatures: 8, shuffleBuffer: 1000"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->training.shuffle_buffer, 1000);
  job = ParseTrainingJob(
      Replace("    optimizer:", "    dataset: {shuffleBuffer: 10}\n    optimizer:"));
  ASSERT_TRUE(job.ok()) << job.status();  // every format streams
  EXPECT_EQ(job->training.shuffle_buffer, 10);
}

TEST(JobSpecErrors, LibsvmDataset) {
  const std::string d = "spec.training.dataset.";
  EXPECT_EQ(ErrorOf(Libsvm("")),
            d + "numFeatures: required for format libsvm (the model's input width: the largest "
                "feature index, plus 1 with indexBase 0)");
  EXPECT_EQ(ErrorOf(Libsvm(", numFeatures: 0")),
            d + "numFeatures: must be in [1, 16777216], got 0");
  EXPECT_EQ(ErrorOf(Libsvm(", numFeatures: 4, shuffleBuffer: 0")),
            d + "shuffleBuffer: must be in [1, 67108864], got 0");
  EXPECT_EQ(ErrorOf(Libsvm(", numFeatures: 4, indexBase: 2")),
            d + "indexBase: must be 0 or 1, got 2");
  EXPECT_EQ(ErrorOf(Libsvm(", numFeatures: 4, labels: multi")),
            d + "labels: must be one of binary, classes, regression, got \"multi\"");
  EXPECT_EQ(ErrorOf(Libsvm(", numFeatures: 4, labels: classes")),
            d + "numClasses: required for labels classes");
  EXPECT_EQ(ErrorOf(Libsvm(", numFeatures: 4, labels: classes, numClasses: 1")),
            d + "numClasses: must be in [2, 65536], got 1");
  EXPECT_EQ(ErrorOf(Libsvm(", numFeatures: 4, numClasses: 3")),
            d + "numClasses: only applies to labels classes, but labels is binary");
  EXPECT_EQ(ErrorOf(Libsvm(", numFeatures: 4, header: true")),
            d + "header: only applies to format csv");
  EXPECT_EQ(ErrorOf(Libsvm(", numFeatures: 4, columns: []")),
            d + "columns: only applies to format csv");
  EXPECT_EQ(ErrorOf(Libsvm(", numFeatures: 4, onBadRecord: ignore")),
            d + "onBadRecord: must be one of fail, skip, got \"ignore\"");
  EXPECT_EQ(ErrorOf(Libsvm(", numFeatures: 4, path: b.svm")),
            d + "trainFiles: format libsvm needs exactly one of path (a file or glob) or "
                "trainFiles");
  EXPECT_EQ(ErrorOf(Libsvm(", numFeatures: 4, labels: regression")),
            "spec.training.model.type: the labels are numbers (labels: regression): regression "
            "needs a layer list with head meanSquaredError");
  EXPECT_EQ(ErrorOf(Libsvm(", numFeatures: 4",
                           "layers: [{type: dense, units: 1}], head: meanSquaredError")),
            "spec.training.model.head: meanSquaredError needs numeric labels (labels: regression)");
  EXPECT_EQ(ErrorOf(Replace("    optimizer:", "    dataset: {numFeatures: 4}\n    optimizer:")),
            d + "numFeatures: only applies to format libsvm");
  EXPECT_EQ(ErrorOf(Replace("    optimizer:", "    dataset: {trainFiles: [a]}\n    optimizer:")),
            d + "trainFiles: only applies to format csv or libsvm");
}

TEST(JobSpecErrors, MissingSections) {
  EXPECT_EQ(ErrorOf(R"(
apiVersion: kubetrain.io/v1
kind: TrainingJob
metadata: {name: x}
spec:
  replicaSpecs: {PS: {}, Worker: {}}
)"),
            "spec.training: required (spec.replicaSpecs.PS.template names no containers of its "
            "own or a `kubetrain` container without a command, so it runs kubetrain's runtime, "
            "which trains what spec.training says)");
  EXPECT_EQ(ErrorOf("apiVersion: kubetrain.io/v1\nkind: TrainingJob\nmetadata: "
                    "{name: x}\n"),
            "spec: required");
  EXPECT_EQ(ErrorOf("apiVersion: kubetrain.io/v1\nkind: TrainingJob\nspec: {}\n"),
            "metadata: required");
}

// A TFJob user's program: every replica names its own containers, so
// spec.training may be left out; one replica without them needs it again.
TEST(JobSpecTest, TrainingIsOptionalWhenEveryReplicaBringsItsContainers) {
  const std::string own = R"(
apiVersion: kubetrain.io/v1
kind: TrainingJob
metadata: {name: tf}
spec:
  replicaSpecs:
    Chief: {template: {spec: {containers: [{name: tensorflow, image: tf:1}]}}}
    PS: {replicas: 2, template: {spec: {containers: [{name: tensorflow, image: tf:1}]}}}
    Worker: {replicas: 2, template: {spec: {containers: [{name: tensorflow, image: tf:1}]}}}
)";
  auto job = ParseTrainingJob(own);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_FALSE(job->has_training);
  EXPECT_EQ(job->num_ps(), 2);
  EXPECT_EQ(job->chief_task_type(), "chief");
  for (const auto& [type, replica] : job->replica_specs)
    EXPECT_TRUE(replica.own_containers) << type;

  std::string mixed = own;
  mixed.replace(mixed.find("PS: {replicas: 2, template: {spec: {containers: [{name: tensorflow, "
                           "image: tf:1}]}}}"),
                std::string("PS: {replicas: 2, template: {spec: {containers: [{name: tensorflow, "
                            "image: tf:1}]}}}")
                    .size(),
                "PS: {replicas: 2, template: {spec: {containers: []}}}");
  EXPECT_EQ(ErrorOf(mixed),
            "spec.training: required (spec.replicaSpecs.PS.template names no containers of its "
            "own or a `kubetrain` container without a command, so it runs kubetrain's runtime, "
            "which trains what spec.training says)");

  auto with_training = ParseTrainingJob(own + "  training: {steps: 10}\n");
  ASSERT_TRUE(with_training.ok()) << with_training.status();
  EXPECT_TRUE(with_training->has_training);
}

// A `kubetrain` container without a command is the runtime, customised (say,
// with the data mounted): it runs spec.training, so that stays required.
TEST(JobSpecTest, RuntimeContainerInATemplateIsNotAProgramOfItsOwn) {
  const std::string base = R"(
apiVersion: kubetrain.io/v1
kind: TrainingJob
metadata: {name: data}
spec:
  replicaSpecs:
    PS: {template: {spec: {containers: [CONTAINER]}}}
    Worker: {template: {spec: {containers: [CONTAINER, {name: sidecar, image: busybox}]}}}
)";
  auto with = [&](const std::string& container) {
    return absl::StrReplaceAll(base, {{"CONTAINER", container}});
  };
  const std::string runtime = "{name: kubetrain, volumeMounts: [{name: d, mountPath: /d}]}";
  EXPECT_EQ(ErrorOf(with(runtime)),
            "spec.training: required (spec.replicaSpecs.PS.template names no containers of its "
            "own or a `kubetrain` container without a command, so it runs kubetrain's runtime, "
            "which trains what spec.training says)");
  auto job = ParseTrainingJob(with(runtime) + "  training: {steps: 10}\n");
  ASSERT_TRUE(job.ok()) << job.status();
  for (const auto& [type, replica] : job->replica_specs)
    EXPECT_FALSE(replica.own_containers) << type;
  // With a command it is the user's program again.
  job = ParseTrainingJob(with("{name: kubetrain, image: me:1, command: [my-ps]}"));
  ASSERT_TRUE(job.ok()) << job.status();
  for (const auto& [type, replica] : job->replica_specs)
    EXPECT_TRUE(replica.own_containers) << type;
}

TEST(JobSpecErrors, ValidateCatchesProgrammaticJobs) {
  TrainingJob job;
  job.name = "built";
  job.replica_specs["PS"].replicas = 1;
  job.replica_specs["Worker"].replicas = 2;
  job.training.steps = 10;
  EXPECT_TRUE(ValidateTrainingJob(job).ok()) << ValidateTrainingJob(job);
  job.replica_specs["Bogus"].replicas = 1;
  EXPECT_EQ(ValidateTrainingJob(job).message(),
            "spec.replicaSpecs.Bogus: unknown replica type (known: PS, Worker, "
            "Chief, Evaluator)");
  job.replica_specs.erase("Bogus");
  job.training.mode = TrainingMode::kAsync;
  job.training.barrier_timeout_seconds = 5;
  EXPECT_EQ(ValidateTrainingJob(job).message(),
            "spec.training.barrierTimeoutSeconds: applies to mode sync, or to async "
            "with maxStaleness");
  job.training.max_staleness = 4;  // a silent worker stops holding others back after 5 s
  EXPECT_TRUE(ValidateTrainingJob(job).ok()) << ValidateTrainingJob(job);
}

}  // namespace
}  // namespace kubetrain

namespace kubetrain {
namespace {

std::string WideDeepExample() {
  std::ifstream in(ExamplePath("census-income-wide-deep.yaml"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string WideDeepWith(const std::string& from, const std::string& to) {
  std::string s = WideDeepExample();
  const size_t pos = s.find(from);
  EXPECT_NE(pos, std::string::npos) << "test bug: " << from;
  if (pos != std::string::npos) s.replace(pos, from.size(), to);
  return s;
}

TEST(JobSpecSparseTest, WideDeepExampleReadsLookedUpColumnsAsIds) {
  absl::StatusOr<TrainingJob> job = ParseTrainingJob(WideDeepExample());
  ASSERT_TRUE(job.ok()) << job.status();
  const TrainingSpec& t = job->training;
  EXPECT_EQ(t.model.head, HeadType::kWideAndDeep);
  ASSERT_EQ(t.model.embeddings.size(), 10u);
  EXPECT_EQ(t.model.embeddings[1].column, "education");
  EXPECT_EQ(t.model.embeddings[1].combiner, Combiner::kMean);
  ASSERT_EQ(t.model.wide.crossed.size(), 5u);
  EXPECT_EQ(t.model.wide.crossed[4].columns.size(), 3u);
  ASSERT_TRUE(t.wide_optimizer.has_value());
  EXPECT_EQ(t.wide_optimizer->type, "adagrad");
  // 10 looked-up columns in column order; 3 numeric features before their slots.
  ASSERT_EQ(t.model.sparse_inputs.size(), 10u);
  EXPECT_EQ(t.model.sparse_inputs[0].column, "workclass");
  EXPECT_EQ(t.model.sparse_inputs[0].vocab, 8);
  EXPECT_EQ(t.model.input_dim, 3);  // the looked-up columns are lookup ids, not features
  absl::StatusOr<Model> model = Model::Create(t.model);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->tables().size(), 25u);  // 10 embeddings, 10 wide columns, 5 crossed
}

// The variant whose wide part trains with FTRL (TF's wide & deep defaults).
TEST(JobSpecSparseTest, WideDeepFtrlExample) {
  absl::StatusOr<TrainingJob> job =
      LoadTrainingJobFile(ExamplePath("census-income-wide-deep-ftrl.yaml"));
  ASSERT_TRUE(job.ok()) << job.status();
  const TrainingSpec& t = job->training;
  ASSERT_TRUE(t.wide_optimizer.has_value());
  EXPECT_EQ(t.wide_optimizer->type, "ftrl");
  EXPECT_EQ(t.wide_optimizer->learning_rate, 0.2);  // min(0.2, 1/sqrt(15))
  EXPECT_EQ(t.wide_optimizer->learning_rate_power, -0.5);
  EXPECT_EQ(t.wide_optimizer->initial_accumulator, 0.1);
  EXPECT_EQ(t.optimizer.type, "adam");
  EXPECT_EQ(t.model.wide.columns.size() + t.model.wide.crossed.size(), 15u);
}

TEST(JobSpecSparseTest, BadSparseSpecsNameTheField) {
  EXPECT_CONTAINS(ErrorOf(WideDeepWith("{column: education, dim: 8}", "{column: age, dim: 8}")),
                  "spec.training.model.embeddings[1].column: column \"age\" is numeric");
  EXPECT_CONTAINS(
      ErrorOf(WideDeepWith("{column: education, dim: 8}", "{column: education, dim: 0}")),
      "spec.training.model.embeddings[1].dim: must be in [1, 65536], got 0");
  EXPECT_CONTAINS(ErrorOf(WideDeepWith("{column: education, dim: 8}", "{column: edu, dim: 8}")),
                  "spec.training.model.embeddings[1].column: no column \"edu\"");
  EXPECT_CONTAINS(ErrorOf(WideDeepWith("{column: sex, dim: 8}", "{column: income, dim: 8}")),
                  "column \"income\" is the label");
  EXPECT_CONTAINS(ErrorOf(WideDeepWith("{columns: [education, occupation], hashBuckets: 1000}",
                                       "{columns: [education, nope], hashBuckets: 1000}")),
                  "spec.training.model.wide.crossed[0].columns[1]: no column \"nope\"");
  EXPECT_CONTAINS(ErrorOf(WideDeepWith("{columns: [education, occupation], hashBuckets: 1000}",
                                       "{columns: [education, occupation], hashBuckets: 0}")),
                  "spec.training.model.wide.crossed[0].hashBuckets");
  EXPECT_CONTAINS(ErrorOf(WideDeepWith("head: wideAndDeep", "head: sigmoid")),
                  "spec.training.model.head: must be wideAndDeep with a wide part, got sigmoid");
  EXPECT_CONTAINS(ErrorOf(WideDeepWith("{column: education, dim: 8}",
                                       "{column: education, dim: 8, combiner: max}")),
                  "spec.training.model.embeddings[1].combiner");
  EXPECT_CONTAINS(ErrorOf(WideDeepWith("          type: adagrad\n          learningRate: 0.05",
                                       "          type: adagrad\n          learningRate: -1")),
                  "spec.training.model.wide.optimizer.learningRate: must be > 0");
  EXPECT_CONTAINS(ErrorOf(WideDeepWith("          type: adagrad\n",
                                       "          type: sgd\n          l1: 0.1\n")),
                  "spec.training.model.wide.optimizer.l1: only applies to type ftrl");
  EXPECT_CONTAINS(ErrorOf(WideDeepWith("          type: adagrad\n",
                                       "          type: sgd\n          learningRatePower: -1\n")),
                  "spec.training.model.wide.optimizer.learningRatePower: only applies to type "
                  "ftrl, but type is sgd");
  EXPECT_EQ(ErrorOf(WideDeepWith("          type: adagrad\n",
                                 "          type: ftrl\n          learningRatePower: 0.5\n")),
            "spec.training.model.wide.optimizer.learningRatePower: must be <= 0, got 0.5");
  absl::StatusOr<TrainingJob> job = ParseTrainingJob(WideDeepWith(
      "          type: adagrad\n", "          type: ftrl\n          learningRatePower: -1\n"));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(job->training.wide_optimizer.has_value());
  EXPECT_EQ(job->training.wide_optimizer->learning_rate_power, -1);
  EXPECT_EQ(job->training.optimizer.learning_rate_power, -0.5);
}

// The wide & deep example with capital-gain and native-country as dynamic
// columns (their ids hashed from the values, rows created on the PS).
std::string DynamicExample(const std::string& embedding_extra = "",
                           const std::string& wide_extra = "") {
  std::string s = WideDeepWith("{name: capital-gain, type: categorical, hashBuckets: 1000}",
                               "{name: capital-gain, type: categorical, dynamic: true}");
  const std::string from = "{column: capital-gain, dim: 8}";
  s.replace(s.find(from), from.size(), "{column: capital-gain, dim: 8" + embedding_extra + "}");
  const std::string wide = "        optimizer:\n          type: adagrad";
  s.replace(s.find(wide), wide.size(), wide_extra + wide);
  return s;
}

TEST(JobSpecSparseTest, AMultiValuedColumnIsMaxValuesIdSlots) {
  std::ifstream in(ExamplePath("census-income-profile.yaml"));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<TrainingJob> job = ParseTrainingJob(text.str());
  ASSERT_TRUE(job.ok()) << job.status();
  const TrainingSpec& t = job->training;
  const ColumnSpec& profile = t.tabular.columns[5];
  EXPECT_EQ(profile.separator, '|');
  EXPECT_EQ(profile.max_values, 8);
  EXPECT_TRUE(profile.as_ids);
  ASSERT_EQ(t.model.sparse_inputs.size(), 1u);
  EXPECT_EQ(t.model.sparse_inputs[0].slots, 8);
  EXPECT_EQ(IdSlots(t.tabular), 8);
  absl::StatusOr<Model> model = Model::Create(t.model);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->id_slots(), 8);
}

TEST(JobSpecSparseTest, ALibsvmWeightedColumnIsOneWeightedInputOverTheFeatures) {
  std::ifstream in(ExamplePath("census-income-libsvm-sparse.yaml"));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<TrainingJob> job = ParseTrainingJob(text.str());
  ASSERT_TRUE(job.ok()) << job.status();
  const TrainingSpec& t = job->training;
  EXPECT_EQ(t.tabular.weighted_column, "features");
  EXPECT_EQ(t.tabular.weighted_max_values, 16);
  ASSERT_EQ(t.model.sparse_inputs.size(), 1u);
  EXPECT_TRUE(t.model.sparse_inputs[0].weighted);
  EXPECT_EQ(t.model.sparse_inputs[0].vocab, 104);
  EXPECT_EQ(t.model.sparse_inputs[0].slots, 16);
  EXPECT_EQ(t.model.input_dim, 0);  // no dense inputs: the features are looked up
  absl::StatusOr<Model> model = Model::Create(t.model);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->id_slots(), 16);
}

TEST(JobSpecSparseTest, DynamicColumnsAndMaxRows) {
  absl::StatusOr<TrainingJob> job =
      ParseTrainingJob(DynamicExample(", maxRows: 5000", "        maxRows: 300\n"));
  ASSERT_TRUE(job.ok()) << job.status();
  const TrainingSpec& t = job->training;
  const ColumnSpec& gain = t.tabular.columns[10];
  EXPECT_EQ(gain.name, "capital-gain");
  EXPECT_TRUE(gain.dynamic && gain.as_ids);
  EXPECT_EQ(t.model.sparse_inputs[7].column, "capital-gain");
  EXPECT_TRUE(t.model.sparse_inputs[7].dynamic);
  EXPECT_EQ(t.model.sparse_inputs[7].vocab, 0);
  EXPECT_EQ(t.model.embeddings[8].max_rows, 5000);
  EXPECT_EQ(t.model.wide.max_rows, 300);
  absl::StatusOr<Model> model = Model::Create(t.model);
  ASSERT_TRUE(model.ok()) << model.status();
  int dynamic = 0;
  for (const VariableSpec& v : model->variables()) {
    if (!v.dynamic) continue;
    ++dynamic;
    EXPECT_TRUE(v.name == "embedding.capital-gain" || v.name == "wide.capital-gain") << v.name;
    EXPECT_EQ(v.max_rows, v.wide ? 300 : 5000);
  }
  EXPECT_EQ(dynamic, 2);
  // The values' ids: a hash of the text, 63 bits.
  EXPECT_EQ(DynamicColumnId("7688"), DynamicColumnId("7688"));
  EXPECT_NE(DynamicColumnId("7688"), DynamicColumnId("7689"));
  EXPECT_GE(DynamicColumnId(""), 0);
}

TEST(JobSpecSparseTest, BadDynamicSpecsNameTheField) {
  EXPECT_CONTAINS(
      ErrorOf(WideDeepWith("{name: capital-gain, type: categorical, hashBuckets: 1000}",
                           "{name: capital-gain, type: categorical, hashBuckets: 10, "
                           "dynamic: true}")),
      "spec.training.dataset.columns[10]: a categorical column needs exactly one of vocabulary, "
      "hashBuckets or dynamic: true");
  EXPECT_CONTAINS(ErrorOf(WideDeepWith("{name: capital-gain, type: categorical, hashBuckets: 1000}",
                                       "{name: capital-gain, type: categorical, dynamic: 3}")),
                  "spec.training.dataset.columns[10].dynamic");
  // A dynamic column nothing looks up.
  EXPECT_CONTAINS(
      ErrorOf(WideDeepWith("{name: fnlwgt, type: ignore}",
                           "{name: fnlwgt, type: categorical, dynamic: true}")),
      "spec.training.dataset.columns[2].dynamic: column \"fnlwgt\" has no vocabulary to one-hot "
      "encode");
  // maxRows: >= 1, only over a dynamic column, and enough for a batch on one PS task.
  EXPECT_CONTAINS(ErrorOf(DynamicExample(", maxRows: 0")),
                  "spec.training.model.embeddings[8].maxRows: must be >= 1, got 0");
  EXPECT_CONTAINS(ErrorOf(WideDeepWith("{column: education, dim: 8}",
                                       "{column: education, dim: 8, maxRows: 100}")),
                  "spec.training.model.embeddings[1].maxRows: only applies to a dynamic column");
  EXPECT_CONTAINS(
      ErrorOf(WideDeepWith("        optimizer:\n          type: adagrad",
                           "        maxRows: 100\n        optimizer:\n"
                           "          type: adagrad")),
      "spec.training.model.wide.maxRows: only applies to wide.columns that are dynamic");
  // batchSize 64 over 2 PS tasks: at least (64 - 1) x 2 + 1 = 127.
  EXPECT_TRUE(ParseTrainingJob(DynamicExample(", maxRows: 127")).ok());
  EXPECT_CONTAINS(ErrorOf(DynamicExample(", maxRows: 126")),
                  "spec.training.model.embeddings[8].maxRows: 126 rows over 2 PS tasks is at most "
                  "63 per task, fewer than the 64 distinct ids one batch can look up in it "
                  "(batchSize 64 x 1 per example), which may all live on one task; use at least "
                  "127 or a smaller batchSize");
  EXPECT_CONTAINS(ErrorOf(DynamicExample("", "        maxRows: 100\n")),
                  "spec.training.model.wide.maxRows: 100 rows over 2 PS tasks");
}

// runPolicy.schedulingPolicy: kValid with the Worker template naming
// `scheduler` and the policy given as a flow mapping.
std::string Gang(const std::string& scheduler, const std::string& policy) {
  std::string s = Replace("    suspend: false\n",
                          absl::StrCat("    suspend: false\n    schedulingPolicy: ", policy, "\n"));
  if (!scheduler.empty()) {
    const std::string from = "        spec:\n          containers:";
    s.replace(s.find(from), from.size(),
              absl::StrCat("        spec:\n          schedulerName: ", scheduler,
                           "\n          containers:"));
  }
  return s;
}

TEST(JobSpecTest, SchedulingPolicyIsAbsentByDefault) {
  auto job = ParseTrainingJob(kValid);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_FALSE(job->run_policy.scheduling_policy.has_value());
  EXPECT_EQ(job->scheduler_name(), "");
  EXPECT_EQ(job->num_tasks(), 5);
}

TEST(JobSpecTest, SchedulingPolicyVolcanoParsesEveryField) {
  auto job = ParseTrainingJob(
      Gang("volcano", "{minAvailable: 3, queue: research, priorityClass: high-priority}"));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(job->run_policy.scheduling_policy.has_value());
  const SchedulingPolicy& p = *job->run_policy.scheduling_policy;
  EXPECT_EQ(p.min_available, 3);
  EXPECT_EQ(p.queue, "research");
  EXPECT_EQ(p.priority_class, "high-priority");
  EXPECT_FALSE(p.schedule_timeout_seconds.has_value());
  EXPECT_EQ(job->scheduler_name(), "volcano");
  EXPECT_EQ(job->replica_specs.at("Worker").scheduler_name, "volcano");
  EXPECT_EQ(job->replica_specs.at("PS").scheduler_name, "");  // inherits at pod creation
  EXPECT_EQ(GangSchedulerOf(job->scheduler_name()), GangScheduler::kVolcano);
  EXPECT_EQ(job->min_available(), 3);
}

TEST(JobSpecTest, SchedulingPolicyMinResourcesAsGiven) {
  auto job = ParseTrainingJob(
      Gang("volcano", "{minResources: {cpu: 8, memory: 16Gi, nvidia.com/gpu: \"2\"}}"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->run_policy.scheduling_policy->min_resources,
            (std::map<std::string, std::string>{
                {"cpu", "8"}, {"memory", "16Gi"}, {"nvidia.com/gpu", "2"}}));
}

TEST(JobSpecTest, SchedulingPolicyEmptyMeansEveryTask) {
  auto job = ParseTrainingJob(Gang("scheduler-plugins-scheduler", "{}"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->run_policy.scheduling_policy.has_value());
  EXPECT_EQ(job->min_available(), 5);
  EXPECT_EQ(GangSchedulerOf(job->scheduler_name()), GangScheduler::kSchedulerPlugins);
  EXPECT_STREQ(GangSchedulerName(GangScheduler::kSchedulerPlugins), "scheduler-plugins");
}

TEST(JobSpecTest, SchedulingPolicySchedulerPluginsTimeout) {
  auto job = ParseTrainingJob(
      Gang("scheduler-plugins-scheduler", "{scheduleTimeoutSeconds: 120, minAvailable: 5}"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->run_policy.scheduling_policy->schedule_timeout_seconds, 120);
}

TEST(JobSpecTest, SchedulingPolicyErrorsNameTheField) {
  EXPECT_EQ(ErrorOf(Gang("volcano", "{minMember: 2}")),
            "spec.runPolicy.schedulingPolicy.minMember: unknown field (known: minAvailable, "
            "queue, priorityClass, scheduleTimeoutSeconds, minResources)");
  EXPECT_STARTS_WITH(ErrorOf(Gang("volcano", "{minResources: {cpu: 2x}}")),
                     "spec.runPolicy.schedulingPolicy.minResources.cpu: \"2x\" is not a quantity");
  EXPECT_EQ(ErrorOf(Gang("volcano", "{minResources: {memory: -1Gi}}")),
            "spec.runPolicy.schedulingPolicy.minResources.memory: \"-1Gi\" is negative");
  EXPECT_STARTS_WITH(ErrorOf(Gang("volcano", "{minResources: {\"a b\": 1}}")),
                     "spec.runPolicy.schedulingPolicy.minResources.a b: is not a resource name");
  EXPECT_STARTS_WITH(ErrorOf(Gang("volcano", "{minResources: {cpu: [1]}}")),
                     "spec.runPolicy.schedulingPolicy.minResources.cpu: expected a quantity");
  EXPECT_EQ(ErrorOf(Gang("volcano", "{minResources: [cpu]}")),
            "spec.runPolicy.schedulingPolicy.minResources: expected a mapping, got a list");
  EXPECT_EQ(ErrorOf(Gang("volcano", "{minAvailable: 6}")),
            "spec.runPolicy.schedulingPolicy.minAvailable: must be in [1, 5], got 6");
  EXPECT_EQ(ErrorOf(Gang("volcano", "{minAvailable: 0}")),
            "spec.runPolicy.schedulingPolicy.minAvailable: must be in [1, 5], got 0");
  EXPECT_EQ(ErrorOf(Gang("volcano", "{minAvailable: \"3\"}")),
            "spec.runPolicy.schedulingPolicy.minAvailable: expected an integer, got \"3\"");
  EXPECT_EQ(ErrorOf(Gang("volcano", "[]")),
            "spec.runPolicy.schedulingPolicy: expected a mapping, got a list");
  EXPECT_STARTS_WITH(ErrorOf(Gang("", "{minAvailable: 2}")),
                     "spec.runPolicy.schedulingPolicy: gang scheduling needs the gang "
                     "scheduler's name: set schedulerName in a replica's template.spec");
  EXPECT_STARTS_WITH(ErrorOf(Gang("my-coscheduler", "{queue: research}")),
                     "spec.runPolicy.schedulingPolicy.queue: only Volcano has queues");
  EXPECT_EQ(ErrorOf(Gang("volcano", "{queue: Research}")),
            "spec.runPolicy.schedulingPolicy.queue: must be a DNS-1123 subdomain, got "
            "\"Research\"");
  EXPECT_EQ(ErrorOf(Gang("volcano", "{priorityClass: -x}")),
            "spec.runPolicy.schedulingPolicy.priorityClass: must be a DNS-1123 subdomain, got "
            "\"-x\"");
  EXPECT_STARTS_WITH(ErrorOf(Gang("volcano", "{scheduleTimeoutSeconds: 60}")),
                     "spec.runPolicy.schedulingPolicy.scheduleTimeoutSeconds: only "
                     "scheduler-plugins' PodGroup has it");
  EXPECT_EQ(ErrorOf(Gang("sp", "{scheduleTimeoutSeconds: 0}")),
            "spec.runPolicy.schedulingPolicy.scheduleTimeoutSeconds: must be >= 1, got 0");
  std::string two = Gang("volcano", "{}");
  two.replace(two.find("    PS:\n"), 8,
              "    PS:\n      template: {spec: {schedulerName: other}}\n");
  EXPECT_EQ(ErrorOf(two),
            "spec.replicaSpecs.Worker.template.spec.schedulerName: must be the same in every "
            "replica with spec.runPolicy.schedulingPolicy (one gang scheduler places all tasks), "
            "got \"volcano\" and \"other\" in spec.replicaSpecs.PS.template.spec.schedulerName");
  EXPECT_EQ(ErrorOf(Gang("[a]", "{}")),
            "spec.replicaSpecs.Worker.template.spec.schedulerName: expected a string, got a list");
}

TEST(JobSpecTest, SchedulerNameWithoutSchedulingPolicyIsJustPassedOn) {
  auto job = ParseTrainingJob(Replace("        spec:\n          containers:",
                                      "        spec:\n          schedulerName: my-scheduler\n"
                                      "          priorityClassName: low\n          containers:"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_FALSE(job->run_policy.scheduling_policy.has_value());
  EXPECT_EQ(job->scheduler_name(), "my-scheduler");
  EXPECT_EQ(job->replica_specs.at("Worker").priority_class_name, "low");
}

TEST(JobSpecTest, TheRuntimeContainersCpuLimitGivesItsReplicasThreads) {
  auto threads_with = [](const std::string& container) -> std::string {
    absl::StatusOr<TrainingJob> job = ParseTrainingJob(
        Replace("          - name: tensorflow\n            image: kubetrain:dev\n", container));
    if (!job.ok()) return std::string(job.status().message());
    return absl::StrCat(job->replica_specs.at("Worker").threads(), " ",
                        job->replica_specs.at("PS").threads());
  };
  auto runtime = [](const std::string& cpu) {
    return "          - name: kubetrain\n            resources: {limits: {cpu: " + cpu + "}}\n";
  };
  EXPECT_EQ(threads_with(runtime("2")), "2 1");  // the PS template names no limit
  EXPECT_EQ(threads_with(runtime("\"2500m\"")), "2 1");
  EXPECT_EQ(threads_with(runtime("1.5")), "1 1");
  EXPECT_EQ(threads_with(runtime("500m")), "1 1");  // a fraction of a core: one thread
  EXPECT_EQ(threads_with(runtime("4096")), "1024 1");
  EXPECT_EQ(threads_with("          - name: kubetrain\n"), "1 1");
  // A container of the user's own (a command) is not the runtime's.
  EXPECT_EQ(threads_with("          - name: kubetrain\n            command: [python3]\n"
                         "            resources: {limits: {cpu: 8}}\n"),
            "1 1");
  EXPECT_STARTS_WITH(threads_with(runtime("two")),
                     "spec.replicaSpecs.Worker.template.spec.containers[0].resources.limits.cpu: "
                     "\"two\" is not a quantity");
  EXPECT_EQ(threads_with(runtime("0")),
            "spec.replicaSpecs.Worker.template.spec.containers[0].resources.limits.cpu: must be > "
            "0, got 0");
}

}  // namespace
}  // namespace kubetrain
