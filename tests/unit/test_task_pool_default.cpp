// Which path decode takes by default (backend/cpu/task_pool.h, task_pool_preferred): the task
// pool where OpenMP's idle threads sleep between regions (OMP_WAIT_POLICY=passive, or a
// GOMP_SPINCOUNT under 10,000 polls: the tools' 1,000 among them), the OpenMP loops where they
// spin (active, libgomp's default, long spin counts). The user's wait policy outranks the spin
// count. Both variables are read as GNU OpenMP reads them. The bits either path computes are
// checked in test_task_pool.cpp ("decode steps give the OpenMP path's bits").
#include <catch2/catch.hpp>

#include "backend/cpu/task_pool.h"

using moe::cpu::task_pool_preferred;

TEST_CASE("task pool default: the pool under a short spin or a passive wait", "[task_pool]") {
  // Neither set: libgomp spins 300,000 polls, the loops' joins are cheap.
  CHECK_FALSE(task_pool_preferred(nullptr, nullptr));
  // The spin count the tools start with (tools/common/omp_wait.h) and others below 10,000.
  for (const char* count : {"1000", "0", "1", "9999", " 3000 ", "9k", "9K"}) {
    INFO("GOMP_SPINCOUNT=" << count);
    CHECK(task_pool_preferred(nullptr, count));
  }
  // From 10,000 polls on the threads spin through a step's gaps, as by default.
  for (const char* count : {"10000", "10k", "300000", "1M", "2g", "1t", "infinite", "INFINITY"}) {
    INFO("GOMP_SPINCOUNT=" << count);
    CHECK_FALSE(task_pool_preferred(nullptr, count));
  }
  // A count libgomp cannot read is ignored there (its default applies): the loops.
  for (const char* count : {"", "  ", "fast", "-", "10x", "5 k k", "99999999999999999999"}) {
    INFO("GOMP_SPINCOUNT='" << count << "'");
    CHECK_FALSE(task_pool_preferred(nullptr, count));
  }
}

TEST_CASE("task pool default: the user's OMP_WAIT_POLICY outranks the spin count", "[task_pool]") {
  for (const char* passive : {"passive", "PASSIVE", "Passive", " passive "}) {
    INFO("OMP_WAIT_POLICY=" << passive);
    CHECK(task_pool_preferred(passive, nullptr));
    CHECK(task_pool_preferred(passive, "300000"));
    CHECK(task_pool_preferred(passive, "1000"));
  }
  for (const char* active : {"active", "ACTIVE", "active "}) {
    INFO("OMP_WAIT_POLICY=" << active);
    CHECK_FALSE(task_pool_preferred(active, nullptr));
    CHECK_FALSE(task_pool_preferred(active, "1000"));
    CHECK_FALSE(task_pool_preferred(active, "0"));
  }
  // A policy libgomp does not know leaves the choice to the spin count.
  CHECK(task_pool_preferred("sleepy", "1000"));
  CHECK_FALSE(task_pool_preferred("sleepy", nullptr));
  CHECK_FALSE(task_pool_preferred("passively", nullptr));
}
