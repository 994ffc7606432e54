#include "operator/expectations.h"

#include "core/log.h"

namespace kubetrain {

void Expectations::ExpectCreate(const std::string& job_key, const std::string& object) {
  absl::MutexLock l(&mu_);
  Pending& p = jobs_[job_key];
  if (p.creates.empty() && p.deletes.empty()) p.since = clock_->Now();
  p.creates.insert(object);
}

void Expectations::ExpectDelete(const std::string& job_key, const std::string& object) {
  absl::MutexLock l(&mu_);
  Pending& p = jobs_[job_key];
  if (p.creates.empty() && p.deletes.empty()) p.since = clock_->Now();
  p.deletes.insert(object);
}

void Expectations::Forget(const std::string& job_key, const std::string& object) {
  absl::MutexLock l(&mu_);
  auto it = jobs_.find(job_key);
  if (it == jobs_.end()) return;
  it->second.creates.erase(object);
  it->second.deletes.erase(object);
  if (it->second.creates.empty() && it->second.deletes.empty()) jobs_.erase(it);
}

void Expectations::Observed(const std::string& job_key, const std::string& object, bool exists) {
  absl::MutexLock l(&mu_);
  auto it = jobs_.find(job_key);
  if (it == jobs_.end()) return;
  (exists ? it->second.creates : it->second.deletes).erase(object);
  if (it->second.creates.empty() && it->second.deletes.empty()) jobs_.erase(it);
}

bool Expectations::Satisfied(const std::string& job_key) {
  absl::MutexLock l(&mu_);
  auto it = jobs_.find(job_key);
  if (it == jobs_.end()) return true;
  if (clock_->Now() - it->second.since < timeout_) return false;
  Log("operator: ", job_key, ": ", it->second.creates.size(), " creates and ",
      it->second.deletes.size(), " deletes not observed after ", absl::FormatDuration(timeout_),
      "; deciding from the cache anyway");
  jobs_.erase(it);
  return true;
}

void Expectations::Clear(const std::string& job_key) {
  absl::MutexLock l(&mu_);
  jobs_.erase(job_key);
}

size_t Expectations::pending() const {
  absl::MutexLock l(&mu_);
  size_t n = 0;
  for (const auto& [k, p] : jobs_) n += p.creates.size() + p.deletes.size();
  return n;
}

}  // namespace kubetrain
