// Everything kubetrain-operator is told on its command line, with the
// defaults, and the flags that set it (registered on a core/flags.h parser).
#ifndef KUBETRAIN_OPERATOR_OPERATOR_OPTIONS_H_
#define KUBETRAIN_OPERATOR_OPERATOR_OPTIONS_H_

#include <string>

#include "core/flags.h"
#include "operator/controller.h"
#include "operator/desired.h"

namespace kubetrain {

struct OperatorOptions {
  std::string kubeconfig;  // default: $KUBECONFIG
  bool in_cluster = false;
  std::string metrics_address = "0.0.0.0:8080";  // "" = off
  std::string health_address = "0.0.0.0:8081";   // "" = off
  bool leader_elect = false;
  std::string leader_election_namespace = "kubetrain-system";
  OperatorConfig config;         // what Desired() builds pods with
  ControllerOptions controller;  // namespace, workers, watch timeout

  // Registers every flag on `parser`, writing into this object; Finish()
  // after parsing copies the integer flags into place.
  void Register(FlagParser* parser);
  void Finish();

 private:
  int64_t port_ = 2222, workers_ = 2, watch_timeout_seconds_ = 60;
};

}  // namespace kubetrain

#endif  // KUBETRAIN_OPERATOR_OPERATOR_OPTIONS_H_
