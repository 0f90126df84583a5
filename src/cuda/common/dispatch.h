// Runtime-to-compile-time dispatch over a constexpr value list.
//
// The list is the single definition of what is instantiated: dispatching a value that is not in it
// returns kUnsupported naming the value and the list, so "supported?" and "which kernel" are
// answered by the same code.
//
//   using HeadDims = ValueList<64, 128>;
//   Status s = dispatch_value<HeadDims>(layer.qk_head_dim, "qk_head_dim", [&]<int kD>() {
//     return launch<kD>(params);
//   });
#pragma once

#include <sstream>
#include <string>
#include <utility>

#include "attnkit/status.h"

namespace attnkit {

template <auto... kValues>
struct ValueList {
  static constexpr int size = sizeof...(kValues);
  static constexpr bool contains(auto v) { return ((v == kValues) || ...); }
  static std::string to_string() {
    std::ostringstream os;
    int i = 0;
    ((os << (i++ ? ", " : "") << static_cast<long long>(kValues)), ...);
    return os.str();
  }
  // The values for which keep(value) holds, in order ("none" when no value does).
  template <typename Keep>
  static std::string to_string_if(Keep&& keep) {
    std::ostringstream os;
    int i = 0;
    ((keep(kValues) ? (void)(os << (i++ ? ", " : "") << static_cast<long long>(kValues)) : (void)0),
     ...);
    return i > 0 ? os.str() : "none";
  }
};

// The head dims of `List` (a kernel family's ValueList) that this build compiled, for a reason
// naming a head dim outside them: "128; the kernels cover 64, 128, 256, ATTNKIT_HEAD_DIMS chooses
// which are compiled".
template <typename List, typename Compiled>
std::string head_dims_built(Compiled&& compiled) {
  return List::to_string_if(std::forward<Compiled>(compiled)) + "; the kernels cover " +
         List::to_string() + ", ATTNKIT_HEAD_DIMS chooses which are compiled";
}

namespace detail {
template <auto kFirst, auto... kRest, typename V, typename F>
Status dispatch_value_impl(ValueList<kFirst, kRest...>, V value, const char* name, F&& f,
                           const std::string& all) {
  if (value == kFirst) return f.template operator()<kFirst>();
  if constexpr (sizeof...(kRest) > 0) {
    return dispatch_value_impl(ValueList<kRest...>{}, value, name, std::forward<F>(f), all);
  } else {
    std::ostringstream os;
    os << name << " " << static_cast<long long>(value) << " is not compiled in (built: " << all
       << ")";
    return Status::unsupported(os.str());
  }
}
}  // namespace detail

// Calls f.template operator()<kValue>() for the list entry equal to `value`; otherwise returns
// kUnsupported: "<name> <value> is not compiled in (built: <list>)".
template <typename List, typename V, typename F>
Status dispatch_value(V value, const char* name, F&& f) {
  if constexpr (List::size == 0) {
    return Status::unsupported(std::string(name) + " " + std::to_string(value) +
                               " is not compiled in (empty list)");
  } else {
    return detail::dispatch_value_impl(List{}, value, name, std::forward<F>(f), List::to_string());
  }
}

}  // namespace attnkit
