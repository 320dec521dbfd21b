// The two status macros Summa needs; Abseil 20220623 ships neither.
#ifndef SUMMA_COMMON_STATUS_MACROS_H_
#define SUMMA_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SUMMA_STATUS_CONCAT_INNER(a, b) a##b
#define SUMMA_STATUS_CONCAT(a, b) SUMMA_STATUS_CONCAT_INNER(a, b)

// Returns from the enclosing function with `expr`'s status when it is not OK.
#define SUMMA_RETURN_IF_ERROR(expr)                  \
  do {                                               \
    ::absl::Status summa_status_ = (expr);           \
    if (!summa_status_.ok()) return summa_status_;   \
  } while (0)

// `SUMMA_ASSIGN_OR_RETURN(auto x, Foo());` declares x from an OK StatusOr, or returns its status.
#define SUMMA_ASSIGN_OR_RETURN(lhs, expr) \
  SUMMA_ASSIGN_OR_RETURN_IMPL(SUMMA_STATUS_CONCAT(summa_statusor_, __LINE__), lhs, expr)
#define SUMMA_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return std::move(tmp).status();    \
  lhs = std::move(tmp).value()

#endif  // SUMMA_COMMON_STATUS_MACROS_H_
