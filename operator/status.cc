#include "operator/status.h"

namespace kubetrain {

using nlohmann::json;

std::string Timestamp(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

std::optional<absl::Time> ParseTimestamp(const json& v) {
  if (!v.is_string()) return std::nullopt;
  absl::Time t;
  std::string err;
  if (!absl::ParseTime(absl::RFC3339_full, v.get<std::string>(), &t, &err)) return std::nullopt;
  return t;
}

const json* FindCondition(const json& status, const std::string& type) {
  if (!status.is_object() || !status.contains("conditions") || !status["conditions"].is_array())
    return nullptr;
  for (const auto& c : status["conditions"]) {
    if (c.is_object() && c.value("type", "") == type) return &c;
  }
  return nullptr;
}

bool IsConditionTrue(const json& status, const std::string& type) {
  const json* c = FindCondition(status, type);
  return c != nullptr && c->value("status", "") == "True";
}

void SetCondition(json* status, const std::string& type, bool value, const std::string& reason,
                  const std::string& message, absl::Time now) {
  json& conds = (*status)["conditions"];
  if (!conds.is_array()) conds = json::array();
  const std::string s = value ? "True" : "False";
  for (auto& c : conds) {
    if (!c.is_object() || c.value("type", "") != type) continue;
    if (c.value("status", "") != s) c["lastTransitionTime"] = Timestamp(now);
    if (c.value("status", "") != s || c.value("reason", "") != reason ||
        c.value("message", "") != message) {
      c["lastUpdateTime"] = Timestamp(now);
    }
    c["status"] = s;
    c["reason"] = reason;
    c["message"] = message;
    return;
  }
  if (!value) return;
  conds.push_back({{"type", type},
                   {"status", s},
                   {"reason", reason},
                   {"message", message},
                   {"lastUpdateTime", Timestamp(now)},
                   {"lastTransitionTime", Timestamp(now)}});
}

bool SetCheckpointCondition(json* status, int64_t failures, int64_t failing,
                            const std::string& message, absl::Time now) {
  const bool was_true = IsConditionTrue(*status, condition::kCheckpointFailing);
  if (failures <= 0 && FindCondition(*status, condition::kCheckpointFailing) == nullptr) {
    return false;
  }
  if (failing > 0) {
    SetCondition(status, condition::kCheckpointFailing, true, reason::kCheckpointWriteFailed,
                 message, now);
  } else {
    SetCondition(status, condition::kCheckpointFailing, false, reason::kCheckpointsWritten,
                 message.empty() ? "checkpoints are written" : message, now);
  }
  return failing > 0 && !was_true;
}

bool IsSucceeded(const json& status) { return IsConditionTrue(status, condition::kSucceeded); }
bool IsFailed(const json& status) { return IsConditionTrue(status, condition::kFailed); }
bool IsFinished(const json& status) { return IsSucceeded(status) || IsFailed(status); }

std::string StateOf(const json& status) {
  for (const char* t : {condition::kFailed, condition::kSucceeded, condition::kSuspended,
                        condition::kRestarting, condition::kRunning, condition::kCreated}) {
    if (IsConditionTrue(status, t)) return t;
  }
  return "Pending";
}

}  // namespace kubetrain
