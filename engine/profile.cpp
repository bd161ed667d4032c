#include "engine/profile.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <stdexcept>
#include <utility>

#include "engine/autograd.hpp"
#include "engine/ops.hpp"

namespace relgrad {

namespace {

using Clock = std::chrono::steady_clock;

struct ProfileState {
    std::mutex mutex;
    std::map<std::pair<std::string, Phase>, ProfileRow> rows;
    Clock::time_point started;
};
ProfileState state;
std::atomic<bool> active{false};

// the thread's open timed scope, if any: its products are added to that scope's row
thread_local const char* open_op = nullptr;
thread_local Phase open_phase = Phase::forward;

ProfileRow& row_of(const std::string& op, Phase phase) {  // state.mutex held
    ProfileRow& row = state.rows[{op, phase}];
    row.op = op;
    row.phase = phase;
    return row;
}

void most_time_first(std::vector<ProfileRow>& rows) {
    std::sort(rows.begin(), rows.end(), [](const ProfileRow& a, const ProfileRow& b) { return a.seconds > b.seconds; });
}

double seconds_between(Clock::time_point from, Clock::time_point to) {
    return std::chrono::duration<double>(to - from).count();
}

}  // namespace

void start_profile() {
    std::lock_guard<std::mutex> lock(state.mutex);
    if (active.load()) throw std::logic_error("start_profile: a profile is already being taken");
    state.rows.clear();
    state.started = Clock::now();
    active.store(true);
}

Profile stop_profile() {
    std::lock_guard<std::mutex> lock(state.mutex);
    if (!active.load()) throw std::logic_error("stop_profile: no profile is being taken");
    active.store(false);
    Profile profile;
    profile.seconds = seconds_between(state.started, Clock::now());
    for (auto& entry : state.rows) profile.rows.push_back(entry.second);
    most_time_first(profile.rows);
    return profile;
}

bool profiling() { return active.load(std::memory_order_relaxed); }

void add_profile(Profile& total, const Profile& more) {
    for (const ProfileRow& row : more.rows) {
        auto same = std::find_if(total.rows.begin(), total.rows.end(), [&](const ProfileRow& r) {
            return r.op == row.op && r.phase == row.phase;
        });
        if (same == total.rows.end()) {
            total.rows.push_back(row);
            continue;
        }
        same->calls += row.calls;
        same->seconds += row.seconds;
        same->gemm_flops += row.gemm_flops;
        same->gemm_seconds += row.gemm_seconds;
    }
    total.seconds += more.seconds;
    most_time_first(total.rows);
}

ProfileScope::ProfileScope(const char* op, Phase phase) : op_(op), phase_(phase) {
    if (!active.load(std::memory_order_relaxed) || open_op) return;
    timing_ = true;
    open_op = op;
    open_phase = phase;
    start_ = Clock::now();
}

ProfileScope::~ProfileScope() {
    if (!timing_) return;
    const double seconds = seconds_between(start_, Clock::now());
    open_op = nullptr;
    std::lock_guard<std::mutex> lock(state.mutex);
    if (!active.load() || start_ < state.started) return;  // the profile it began in has ended
    ProfileRow& row = row_of(op_, phase_);
    ++row.calls;
    row.seconds += seconds;
}

void profile_gemm(double flops, double seconds) {
    std::lock_guard<std::mutex> lock(state.mutex);
    if (!active.load()) return;
    ProfileRow& row = open_op ? row_of(open_op, open_phase) : row_of("(no op)", Phase::forward);
    row.gemm_flops += flops;
    row.gemm_seconds += seconds;
}

double measure_gemm_gflops() {
    NoGradGuard no_graph;
    constexpr int64_t n = 1024;
    Generator gen(1);
    const Tensor a = randn({n, n}, gen), b = randn({n, n}, gen);
    matmul(a, b);  // warm-up: threads started, pages touched
    std::vector<double> seconds;
    for (int i = 0; i < 5; ++i) {
        const auto start = Clock::now();
        matmul(a, b);
        seconds.push_back(seconds_between(start, Clock::now()));
    }
    std::sort(seconds.begin(), seconds.end());
    return 2.0 * n * n * n / seconds[2] / 1e9;
}

std::string profile_table(const Profile& profile, double machine_gflops) {
    std::string out;
    char line[256];
    std::snprintf(line, sizeof line, "%-28s %-9s %8s %11s %7s %9s\n", "op", "phase", "calls", "total ms", "share",
                  "GFLOP/s");
    out += line;
    const double total = std::max(profile.seconds, 1e-12);
    double in_ops = 0, flops = 0, gemm_seconds = 0;
    for (const ProfileRow& row : profile.rows) {
        in_ops += row.seconds;
        flops += row.gemm_flops;
        gemm_seconds += row.gemm_seconds;
        char rate[32] = "";
        if (row.gemm_seconds > 0) std::snprintf(rate, sizeof rate, "%.1f", row.gemm_flops / row.gemm_seconds / 1e9);
        std::snprintf(line, sizeof line, "%-28s %-9s %8lld %11.1f %6.1f%% %9s\n", row.op.c_str(),
                      name_of(phase_names, row.phase), static_cast<long long>(row.calls), row.seconds * 1e3,
                      100 * row.seconds / total, rate);
        out += line;
    }
    std::snprintf(line, sizeof line, "%-28s %-9s %8s %11.1f %6.1f%%\n", "(outside every op)", "", "",
                  (profile.seconds - in_ops) * 1e3, 100 * (profile.seconds - in_ops) / total);
    out += line;
    std::snprintf(line, sizeof line, "%-28s %-9s %8s %11.1f %6.1f%%\n", "total", "", "", profile.seconds * 1e3, 100.0);
    out += line;
    if (flops > 0) {
        std::snprintf(line, sizeof line,
                      "matrix products: %.1f GFLOP in %.1f ms (%.1f%% of the time), %.1f GFLOP/s inside them\n",
                      flops / 1e9, gemm_seconds * 1e3, 100 * gemm_seconds / total, flops / gemm_seconds / 1e9);
        out += line;
        std::snprintf(line, sizeof line,
                      "over the whole time: %.1f GFLOP/s, %.0f%% of this machine's %.1f GFLOP/s (float32 1024^3 "
                      "products, %d threads)\n",
                      flops / total / 1e9, 100 * flops / total / 1e9 / machine_gflops, machine_gflops,
                      omp_get_max_threads());
        out += line;
    }
    return out;
}

}  // namespace relgrad
