// ThreadSanitizer and Debian's Abseil. libabsl_synchronization is not built with TSan, so TSan
// sees no happens-before through absl::Mutex, CondVar or Notification (they synchronize with
// atomics and futexes inside that library) and would report every field an absl::Mutex guards as
// a race. In the TSan build (scripts/test.sh --sanitize=thread) every call of ours into them is
// linked to these wrappers instead (ld --wrap, listed in tests/CMakeLists.txt), which tell TSan
// what the call did with the annotations Abseil itself makes when it is built with TSan
// (absl/synchronization/mutex.cc). Accesses inside a wrapped call (Abseil evaluating a
// Condition of ours while it holds the lock) are ignored, as TSan ignores a mutex's internals.
// Synchronization inside gRPC's own use of Abseil stays invisible.
//
// SUMMA_ABSL_NS is Abseil's inline namespace as it is mangled ("7debian3").
#include <sanitizer/tsan_interface.h>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

#define SUMMA_REAL(name) __asm__("__real__ZN4absl" SUMMA_ABSL_NS name)
#define SUMMA_WRAP(name) __asm__("__wrap__ZN4absl" SUMMA_ABSL_NS name)
#define SUMMA_REAL_CONST(name) __asm__("__real__ZNK4absl" SUMMA_ABSL_NS name)
#define SUMMA_WRAP_CONST(name) __asm__("__wrap__ZNK4absl" SUMMA_ABSL_NS name)

namespace summa::tsan {

using absl::Condition;
using absl::CondVar;
using absl::Duration;
using absl::Mutex;
using absl::Notification;
using absl::Time;

// Abseil's own member functions, called with `this` first (the Itanium ABI's layout).
void RealLock(Mutex*) SUMMA_REAL("5Mutex4LockEv");
void RealUnlock(Mutex*) SUMMA_REAL("5Mutex6UnlockEv");
bool RealTryLock(Mutex*) SUMMA_REAL("5Mutex7TryLockEv");
void RealReaderLock(Mutex*) SUMMA_REAL("5Mutex10ReaderLockEv");
void RealReaderUnlock(Mutex*) SUMMA_REAL("5Mutex12ReaderUnlockEv");
bool RealReaderTryLock(Mutex*) SUMMA_REAL("5Mutex13ReaderTryLockEv");
void RealAwait(Mutex*, const Condition&) SUMMA_REAL("5Mutex5AwaitERKNS0_9ConditionE");
bool RealAwaitWithTimeout(Mutex*, const Condition&, Duration)
    SUMMA_REAL("5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
bool RealAwaitWithDeadline(Mutex*, const Condition&, Time)
    SUMMA_REAL("5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
void RealLockWhen(Mutex*, const Condition&) SUMMA_REAL("5Mutex8LockWhenERKNS0_9ConditionE");
void RealCondVarWait(CondVar*, Mutex*) SUMMA_REAL("7CondVar4WaitEPNS0_5MutexE");
bool RealCondVarWaitWithTimeout(CondVar*, Mutex*, Duration)
    SUMMA_REAL("7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
bool RealCondVarWaitWithDeadline(CondVar*, Mutex*, Time)
    SUMMA_REAL("7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
void RealNotify(Notification*) SUMMA_REAL("12Notification6NotifyEv");
void RealWaitForNotification(const Notification*) SUMMA_REAL_CONST("12Notification19WaitForNotificationEv");
bool RealWaitForNotificationWithTimeout(const Notification*, Duration)
    SUMMA_REAL_CONST("12Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
bool RealWaitForNotificationWithDeadline(const Notification*, Time)
    SUMMA_REAL_CONST("12Notification31WaitForNotificationWithDeadlineENS0_4TimeE");

namespace {

constexpr unsigned kRead = __tsan_mutex_read_lock;
constexpr unsigned kTry = __tsan_mutex_try_lock;

void Locked(Mutex* mu, unsigned flags) { __tsan_mutex_post_lock(mu, flags, 0); }

// A wait that releases `mu` and holds it again when it returns: an unlock, then a lock that
// ignores what happens until then (Abseil evaluating the Condition with `mu` held).
template <typename Wait>
auto ReleaseAndReacquire(Mutex* mu, Wait wait) {
  __tsan_mutex_pre_unlock(mu, 0);
  __tsan_mutex_post_unlock(mu, 0);
  __tsan_mutex_pre_lock(mu, 0);
  auto result = wait();
  Locked(mu, 0);
  return result;
}

// Notification: Notify releases, a wait that saw it acquires. HasBeenNotified is inline (an
// acquire load of the flag that follows the Notification's mutex), so Notify releases there too.
void* Flag(const Notification* n) { return const_cast<char*>(reinterpret_cast<const char*>(n) + sizeof(Mutex)); }
void Notified(const Notification* n) {
  __tsan_acquire(const_cast<Notification*>(n));
}

}  // namespace

void WrapLock(Mutex* mu) SUMMA_WRAP("5Mutex4LockEv");
void WrapLock(Mutex* mu) {
  __tsan_mutex_pre_lock(mu, 0);
  RealLock(mu);
  Locked(mu, 0);
}

void WrapUnlock(Mutex* mu) SUMMA_WRAP("5Mutex6UnlockEv");
void WrapUnlock(Mutex* mu) {
  __tsan_mutex_pre_unlock(mu, 0);
  RealUnlock(mu);
  __tsan_mutex_post_unlock(mu, 0);
}

bool WrapTryLock(Mutex* mu) SUMMA_WRAP("5Mutex7TryLockEv");
bool WrapTryLock(Mutex* mu) {
  __tsan_mutex_pre_lock(mu, kTry);
  const bool locked = RealTryLock(mu);
  Locked(mu, kTry | (locked ? 0 : __tsan_mutex_try_lock_failed));
  return locked;
}

void WrapReaderLock(Mutex* mu) SUMMA_WRAP("5Mutex10ReaderLockEv");
void WrapReaderLock(Mutex* mu) {
  __tsan_mutex_pre_lock(mu, kRead);
  RealReaderLock(mu);
  Locked(mu, kRead);
}

void WrapReaderUnlock(Mutex* mu) SUMMA_WRAP("5Mutex12ReaderUnlockEv");
void WrapReaderUnlock(Mutex* mu) {
  __tsan_mutex_pre_unlock(mu, kRead);
  RealReaderUnlock(mu);
  __tsan_mutex_post_unlock(mu, kRead);
}

bool WrapReaderTryLock(Mutex* mu) SUMMA_WRAP("5Mutex13ReaderTryLockEv");
bool WrapReaderTryLock(Mutex* mu) {
  __tsan_mutex_pre_lock(mu, kRead | kTry);
  const bool locked = RealReaderTryLock(mu);
  Locked(mu, kRead | kTry | (locked ? 0 : __tsan_mutex_try_lock_failed));
  return locked;
}

void WrapAwait(Mutex* mu, const Condition& c) SUMMA_WRAP("5Mutex5AwaitERKNS0_9ConditionE");
void WrapAwait(Mutex* mu, const Condition& c) {
  ReleaseAndReacquire(mu, [&] {
    RealAwait(mu, c);
    return 0;
  });
}

bool WrapAwaitWithTimeout(Mutex* mu, const Condition& c, Duration d)
    SUMMA_WRAP("5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
bool WrapAwaitWithTimeout(Mutex* mu, const Condition& c, Duration d) {
  return ReleaseAndReacquire(mu, [&] { return RealAwaitWithTimeout(mu, c, d); });
}

bool WrapAwaitWithDeadline(Mutex* mu, const Condition& c, Time t)
    SUMMA_WRAP("5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
bool WrapAwaitWithDeadline(Mutex* mu, const Condition& c, Time t) {
  return ReleaseAndReacquire(mu, [&] { return RealAwaitWithDeadline(mu, c, t); });
}

void WrapLockWhen(Mutex* mu, const Condition& c) SUMMA_WRAP("5Mutex8LockWhenERKNS0_9ConditionE");
void WrapLockWhen(Mutex* mu, const Condition& c) {
  __tsan_mutex_pre_lock(mu, 0);
  RealLockWhen(mu, c);
  Locked(mu, 0);
}

void WrapCondVarWait(CondVar* cv, Mutex* mu) SUMMA_WRAP("7CondVar4WaitEPNS0_5MutexE");
void WrapCondVarWait(CondVar* cv, Mutex* mu) {
  ReleaseAndReacquire(mu, [&] {
    RealCondVarWait(cv, mu);
    return 0;
  });
}

bool WrapCondVarWaitWithTimeout(CondVar* cv, Mutex* mu, Duration d)
    SUMMA_WRAP("7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
bool WrapCondVarWaitWithTimeout(CondVar* cv, Mutex* mu, Duration d) {
  return ReleaseAndReacquire(mu, [&] { return RealCondVarWaitWithTimeout(cv, mu, d); });
}

bool WrapCondVarWaitWithDeadline(CondVar* cv, Mutex* mu, Time t)
    SUMMA_WRAP("7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
bool WrapCondVarWaitWithDeadline(CondVar* cv, Mutex* mu, Time t) {
  return ReleaseAndReacquire(mu, [&] { return RealCondVarWaitWithDeadline(cv, mu, t); });
}

void WrapNotify(Notification* n) SUMMA_WRAP("12Notification6NotifyEv");
void WrapNotify(Notification* n) {
  __tsan_release(n);
  __tsan_release(Flag(n));
  RealNotify(n);
}

void WrapWaitForNotification(const Notification* n) SUMMA_WRAP_CONST("12Notification19WaitForNotificationEv");
void WrapWaitForNotification(const Notification* n) {
  RealWaitForNotification(n);
  Notified(n);
}

bool WrapWaitForNotificationWithTimeout(const Notification* n, Duration d)
    SUMMA_WRAP_CONST("12Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
bool WrapWaitForNotificationWithTimeout(const Notification* n, Duration d) {
  const bool notified = RealWaitForNotificationWithTimeout(n, d);
  if (notified) Notified(n);
  return notified;
}

bool WrapWaitForNotificationWithDeadline(const Notification* n, Time t)
    SUMMA_WRAP_CONST("12Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
bool WrapWaitForNotificationWithDeadline(const Notification* n, Time t) {
  const bool notified = RealWaitForNotificationWithDeadline(n, t);
  if (notified) Notified(n);
  return notified;
}

}  // namespace summa::tsan
