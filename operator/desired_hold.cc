// Desired(), after a job that did not succeed: the end of a job never
// destroys the only copy of the parameters. A PS task that is stopped (its pod
// deleted by cleanPodPolicy or the TTL) writes a final checkpoint; if it
// cannot, it holds the parameters read-only for `kubetrain export --from-ps`
// (ps/ps_task.h) within its pod's long termination grace period
// (kPsTerminationGraceSeconds). Meanwhile the job stays (so do its ConfigMap,
// which the export reads, and the condition that says how to save the model):
// ParametersHeld is True while a PS task holds, False once they are gone.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "operator/desired_internal.h"
#include "operator/status.h"

namespace kubetrain {

bool PsTasksMayHoldParameters(const TrainingJob& spec, const nlohmann::json& status) {
  if (IsSucceeded(status) || !spec.has_training || spec.training.checkpoint_dir.empty()) {
    return false;
  }
  auto ps = spec.replica_specs.find("PS");
  return ps != spec.replica_specs.end() && !ps->second.own_containers;
}

namespace desired_internal {
namespace {

// Local ports of the recipe's port-forwards: ps-i on kExportLocalPort + i.
constexpr int kExportLocalPort = 22220;

std::string PodNames(const std::vector<const ObservedPod*>& pods) {
  std::vector<std::string> names;
  for (const ObservedPod* p : pods) names.push_back(p->name);
  return absl::StrJoin(names, ", ");
}

// What the user runs to save the model from the held PS tasks: forward each
// PS task's port, read the job file from the job's ConfigMap and the job's
// key (and TLS files) from its Secret (the PS tasks admit only the job's
// tasks: the exporter's token is derived from the key), export.
std::string SaveModelRecipe(const JobObject& job, const TrainingJob& spec, const Observed& observed,
                            const OperatorConfig& config) {
  const int ps = spec.replica_specs.at("PS").replicas;
  const std::string kubectl = absl::StrCat("kubectl -n ", job.namespace_);
  std::string out;
  std::vector<std::string> addresses, pods;
  for (int i = 0; i < ps; ++i) {
    const std::string pod = ReplicaName(job.name, "ps", i);
    absl::StrAppend(&out, "  ", kubectl, " port-forward pod/", pod, " ", kExportLocalPort + i, ":",
                    config.port, " &\n");
    addresses.push_back(absl::StrCat("127.0.0.1:", kExportLocalPort + i));
    pods.push_back(pod);
  }
  absl::StrAppend(&out, "  ", kubectl, " get configmap ", ConfigMapName(job.name),
                  " -o jsonpath='{.data.trainingjob\\.yaml}' > ", job.name, ".yaml\n");
  std::string auth_dir;
  if (observed.auth_secret) {
    auth_dir = AuthSecretName(job.name);  // a local directory named after the Secret
    absl::StrAppend(&out, "  mkdir -m 700 ", auth_dir, "\n");
    for (const char* file : {kJobKeyFile, kCaCertFile, kCertFile, kKeyFile}) {
      if (!observed.auth_secret->keys.count(file)) continue;
      absl::StrAppend(&out, "  ", kubectl, " get secret ", AuthSecretName(job.name),
                      " -o jsonpath='{.data.", absl::StrReplaceAll(file, {{".", "\\."}}),
                      "}' | base64 -d > ", auth_dir, "/", file, "\n");
    }
  }
  absl::StrAppend(&out, "  kubetrain export --from-ps ", absl::StrJoin(addresses, ","), " --job ",
                  job.name, ".yaml --output ", job.name, "-model.ktm",
                  auth_dir.empty() ? "" : " --auth-dir ", auth_dir, "\n");
  absl::StrAppend(&out, "then end the hold: ", kubectl, " delete pod ", absl::StrJoin(pods, " "),
                  " --grace-period=1");
  return out;
}

}  // namespace

bool KeepUnsavedParameters(const JobObject& job, const TrainingJob& spec, const Observed& observed,
                           const OperatorConfig& config, bool stop_running, Actions* a) {
  if (!PsTasksMayHoldParameters(spec, a->status)) return false;
  std::vector<const ObservedPod*> live, holding;
  bool stopping = false;
  absl::Time deadline = absl::InfiniteFuture();
  for (const ObservedPod& p : observed.pods) {
    if (p.type != "ps" || p.phase != "Running") continue;
    live.push_back(&p);
    if (p.holds_unsaved_parameters) {
      holding.push_back(&p);
      deadline = std::min(deadline, p.deletion_deadline);
    } else if (p.deleting) {
      stopping = true;  // writing its final checkpoint, or about to hold
    } else if (stop_running) {
      // It saves its final checkpoint, or holds.
      if (std::find(a->delete_pods.begin(), a->delete_pods.end(), p.name) == a->delete_pods.end()) {
        a->delete_pods.push_back(p.name);
      }
      stopping = true;
    }
  }
  const absl::Time now = observed.now;
  if (!holding.empty()) {
    const std::string message = absl::StrCat(
        PodNames(holding),
        " could not write the final checkpoint to spec.training.checkpoint.directory ",
        spec.training.checkpoint_dir, " and hold the trained parameters read-only",
        deadline == absl::InfiniteFuture() ? "" : absl::StrCat(" until ", Timestamp(deadline)),
        "; then they are gone. Save the model now (docs/trainingjob.md, \"Full, read-only and "
        "failing disks\"), with every PS task:\n",
        SaveModelRecipe(job, spec, observed, config));
    if (!IsConditionTrue(a->status, condition::kParametersHeld)) {
      a->events.push_back({"Warning", reason::kFinalCheckpointFailed, message});
    }
    SetCondition(&a->status, condition::kParametersHeld, true, reason::kFinalCheckpointFailed,
                 message, now);
  } else if (IsConditionTrue(a->status, condition::kParametersHeld) && live.empty()) {
    std::vector<std::string> ends;
    for (const ObservedPod& p : observed.pods) {
      if (p.type != "ps") continue;
      const std::string end = DescribeTermination(p);
      ends.push_back(end.empty() ? absl::StrCat(p.name, " ", p.phase) : end);
    }
    const std::string message = absl::StrCat(
        "The PS tasks no longer hold the parameters",
        ends.empty() ? " (their pods are gone)" : absl::StrCat(": ", absl::StrJoin(ends, "; ")));
    SetCondition(&a->status, condition::kParametersHeld, false, reason::kParametersReleased,
                 message, now);
    a->events.push_back({"Normal", reason::kParametersReleased, message});
  }
  // Whether a stopping PS task holds shows only in its metrics: look again.
  if (stopping && holding.empty() &&
      (!a->requeue_after || config.progress_interval < *a->requeue_after)) {
    a->requeue_after = config.progress_interval;
  }
  return !live.empty();
}

}  // namespace desired_internal
}  // namespace kubetrain
