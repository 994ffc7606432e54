// Bounds on what a YAML text may make its reader do, checked before the text
// is loaded into a tree and walked. An alias repeats the node its anchor
// names, so ten anchors that each list ten aliases of the previous one (a
// "billion laughs", under 1 KB) stand for 10^10 nodes: yaml-cpp shares them,
// but every walk over the tree (checking it, re-emitting it, copying it)
// visits each one. An alias inside the node it names is a cycle no walk ends.
#ifndef KUBETRAIN_CORE_YAML_LIMITS_H_
#define KUBETRAIN_CORE_YAML_LIMITS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace kubetrain {

// How many nodes the aliases of one YAML document may stand for in all, each
// alias counted as the nodes it repeats (aliases inside them included). A job
// that shares a pod template among three replica types repeats a few hundred;
// the limit is far above any real file and far below a slow walk.
inline constexpr int64_t kMaxYamlAliasNodes = 100000;

// Reads `yaml_text` as parser events (no tree is built; linear in its size)
// and fails with InvalidArgument if, in any of its documents, the aliases
// stand for more than `max_alias_nodes` nodes, or an alias lies inside the
// node its anchor names:
//   invalid YAML at line L, column C: alias *a5 would expand the document past
//   100000 nodes (aliases of aliases multiply: an alias bomb)
// naming the alias where the limit is crossed (line and column from 1). A
// syntax error gives the same "invalid YAML at line L, column C: <what>" as
// yaml-cpp's own exception would.
absl::Status CheckAliasExpansion(const std::string& yaml_text,
                                 int64_t max_alias_nodes = kMaxYamlAliasNodes);

}  // namespace kubetrain

#endif  // KUBETRAIN_CORE_YAML_LIMITS_H_
