// relgrad: where a computation's time goes, per op, as PyTorch profiler's key_averages() table.
//
// Between start_profile() and stop_profile() (`relgrad train --profile`, `relgrad.profile()` in
// Python) every op times its forward, run_backward times each node's backward under the op's
// name, and the optimizer times its step. Only the outermost timed call on a thread counts: the
// ops layer_norm calls inside itself are layer_norm's time, and everything a backward function
// computes is that op's backward. The matrix products are timed apart as well, inside whatever
// op ran them, with their FLOPs, so the table can say what rate they reached. Outside a profile
// a timed call costs one relaxed atomic load.
//
// Times are the host's wall clock: on the CPU that is the work itself; on cuda, whose kernels run
// asynchronously, it is the time to launch them unless something waits for the device.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/enum_names.hpp"

namespace relgrad {

enum class Phase { forward, backward, update };  // an op's forward, its backward, an optimizer's work
inline constexpr EnumName<Phase> phase_names[] = {
    {Phase::forward, "forward"}, {Phase::backward, "backward"}, {Phase::update, "update"}};

struct ProfileRow {
    std::string op;
    Phase phase = Phase::forward;
    int64_t calls = 0;
    double seconds = 0;        // the outermost calls' wall time, all they ran inside included
    double gemm_flops = 0;     // 2 M N K of each matrix product run inside
    double gemm_seconds = 0;   // the time inside those products
};

struct Profile {
    std::vector<ProfileRow> rows;  // by time, largest first
    double seconds = 0;            // wall time from start_profile() to stop_profile()
};

void start_profile();    // starts an empty profile (throws if one is being taken)
Profile stop_profile();  // ends it and returns what it saw (throws if none is being taken)
bool profiling();
void add_profile(Profile& total, const Profile& more);  // rows and times summed, e.g. over steps

// Times the enclosing scope as `op` in `phase` when a profile is being taken and no other timed
// scope is open on this thread.
class ProfileScope {
public:
    explicit ProfileScope(const char* op, Phase phase = Phase::forward);
    ~ProfileScope();
    ProfileScope(const ProfileScope&) = delete;
    ProfileScope& operator=(const ProfileScope&) = delete;

private:
    const char* op_;
    Phase phase_;
    bool timing_ = false;
    std::chrono::steady_clock::time_point start_;
};

// A profile of the enclosing scope added to *total (nothing when total is null), ended even when
// the scope throws.
class ProfileInto {
public:
    explicit ProfileInto(Profile* total) : total_(total) {
        if (total_) start_profile();
    }
    ~ProfileInto() {
        if (total_) add_profile(*total_, stop_profile());
    }
    ProfileInto(const ProfileInto&) = delete;
    ProfileInto& operator=(const ProfileInto&) = delete;

private:
    Profile* total_;
};

// Called by Backend::batched_gemm around each product: its FLOPs and wall time, added to the
// open scope's row (or to "(no op)" when a kernel was called directly).
void profile_gemm(double flops, double seconds);

// This machine's float32 matrix-product rate, GFLOP/s: the median of 5 products of 1024 x 1024
// matrices on relgrad's threads, the yardstick the table compares the reached rate with.
double measure_gemm_gflops();

// The table: op, phase, calls, total ms, share of the profiled time, and GFLOP/s of the rows that
// ran products; then the time outside every op, and the products' rate against machine_gflops.
std::string profile_table(const Profile& profile, double machine_gflops);

}  // namespace relgrad
