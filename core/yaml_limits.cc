#include "core/yaml_limits.h"

#include <yaml-cpp/anchor.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <exception>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kubetrain {
namespace {

absl::Status AtMark(const YAML::Mark& mark, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("invalid YAML at line ", mark.line + 1,
                                                 ", column ", mark.column + 1, ": ", what));
}

// Counts, per document, the nodes each anchored node stands for (itself and
// everything under it, aliases expanded) and the nodes all aliases repeat.
// The parser cannot be stopped from a handler (short of throwing through
// yaml-cpp), so after the first error the remaining events are ignored: they
// cost no more than reading the text.
class AliasCounter : public YAML::EventHandler {
 public:
  explicit AliasCounter(int64_t max_alias_nodes) : max_alias_nodes_(max_alias_nodes) {}

  const absl::Status& status() const { return status_; }

  void OnDocumentStart(const YAML::Mark&) override {
    // Anchor ids start again at 1 in each document.
    sizes_.clear();
    names_.clear();
    open_.clear();
    pending_name_.clear();
    alias_nodes_ = 0;
  }
  void OnDocumentEnd() override {}

  void OnAnchor(const YAML::Mark&, const std::string& name) override { pending_name_ = name; }

  void OnNull(const YAML::Mark&, YAML::anchor_t anchor) override { Leaf(anchor); }
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t anchor,
                const std::string&) override {
    Leaf(anchor);
  }
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    Open(anchor);
  }
  void OnSequenceEnd() override { Close(); }
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    Open(anchor);
  }
  void OnMapEnd() override { Close(); }

  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    if (!status_.ok()) return;
    auto size = sizes_.find(anchor);
    if (size == sizes_.end()) {
      // The parser refuses an alias of an undefined anchor, so this one names
      // a collection still open around it: the tree would contain itself.
      status_ = AtMark(mark, absl::StrCat("alias *", Name(anchor),
                                          " is inside the node it names (a structure that "
                                          "contains itself has no end)"));
      return;
    }
    alias_nodes_ += size->second;
    if (alias_nodes_ > max_alias_nodes_) {
      status_ = AtMark(mark, absl::StrCat("alias *", Name(anchor),
                                          " would expand the document past ", max_alias_nodes_,
                                          " nodes (aliases of aliases multiply: an alias bomb)"));
      return;
    }
    Add(size->second);
  }

 private:
  struct Collection {
    YAML::anchor_t anchor;
    int64_t nodes;  // the collection itself and what is under it so far
  };

  void Leaf(YAML::anchor_t anchor) {
    Name(anchor);
    Add(1);
    if (anchor != YAML::NullAnchor) sizes_[anchor] = 1;
  }
  void Open(YAML::anchor_t anchor) {
    Name(anchor);
    open_.push_back({anchor, 1});
  }
  void Close() {
    if (open_.empty()) return;
    const Collection done = open_.back();
    open_.pop_back();
    Add(done.nodes);
    if (done.anchor != YAML::NullAnchor) sizes_[done.anchor] = done.nodes;
  }
  void Add(int64_t nodes) {
    if (!open_.empty()) open_.back().nodes += nodes;
  }
  // The anchor's name: OnAnchor comes just before the event of the node it
  // names, which carries the anchor's id.
  std::string Name(YAML::anchor_t anchor) {
    if (anchor == YAML::NullAnchor) return "";
    if (!pending_name_.empty()) names_[anchor] = std::move(pending_name_);
    pending_name_.clear();
    return names_[anchor];
  }

  const int64_t max_alias_nodes_;
  absl::Status status_;
  std::map<YAML::anchor_t, int64_t> sizes_;  // anchors whose node is complete
  std::map<YAML::anchor_t, std::string> names_;
  std::vector<Collection> open_;
  std::string pending_name_;
  // Every node an alias repeated stays below the limit (the check precedes the
  // sum), so no count here can overflow.
  int64_t alias_nodes_ = 0;
};

}  // namespace

absl::Status CheckAliasExpansion(const std::string& yaml_text, int64_t max_alias_nodes) {
  AliasCounter counter(max_alias_nodes);
  try {
    std::istringstream in(yaml_text);
    YAML::Parser parser(in);
    while (counter.status().ok() && parser.HandleNextDocument(counter)) {
    }
  } catch (const YAML::Exception& e) {
    if (!counter.status().ok()) return counter.status();
    return AtMark(e.mark, e.msg);
  } catch (const std::exception& e) {
    // yaml-cpp may throw standard exceptions too; none may escape the API.
    return absl::InvalidArgumentError(absl::StrCat("invalid YAML: ", e.what()));
  }
  return counter.status();
}

}  // namespace kubetrain
