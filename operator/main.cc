// kubetrain-operator: reconciles TrainingJobs (kubetrain.io/v1). Flags are
// parsed here, once (operator/operator_options.h); the operator itself is an
// object (operator/operator_process.h) that gets its configuration passed in.
// Exit code 0 after SIGTERM/SIGINT, 1 when the leader lease is lost, 2 on a
// configuration error.
#include <malloc.h>
#include <signal.h>

#include <atomic>

#include "core/flags.h"
#include "core/log.h"
#include "operator/operator_options.h"
#include "operator/operator_process.h"

namespace {
std::atomic<bool> g_stop{false};  // set by SIGTERM/SIGINT
void OnSignal(int) { g_stop.store(true); }
}  // namespace

int main(int argc, char** argv) {
  using namespace kubetrain;  // NOLINT: main only wires objects together
  InitProcess(ProcessProfile::kDefault);
  // Reconcile workers and their create fan-out are many short-lived threads:
  // without a cap glibc gives each its own malloc arena, doubling the RSS.
  mallopt(M_ARENA_MAX, 2);
  OperatorOptions o;
  FlagParser parser("kubetrain-operator [--kubeconfig FILE | --in-cluster]");
  o.Register(&parser);
  if (auto exit_code = parser.ParseMain(argc, argv)) return *exit_code;
  o.Finish();
  if (absl::Status s = o.Validate(); !s.ok()) return Log("error: ", s.message()), 2;
  auto process = OperatorProcess::Start(o);
  if (!process.ok()) return Log("error: ", process.status().message()), 2;
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  return (*process)->Run(&g_stop).ok() ? 0 : 1;
}
