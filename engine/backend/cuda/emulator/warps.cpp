// The CUDA emulator's warp-scoped points (state.hpp says how the parts fit): __syncwarp, the
// __shfl_*_sync shuffles, mma.sync and ldmatrix. A lane at one yields to the scheduler with what it
// brings; once every lane of its mask has come, release_warps gives each lane its result (the value
// a shuffle reads, the tile an mma.sync computes, the registers ldmatrix fills) and lets the warp go
// on. Between two points the lanes run one after another, so code that leans on lanes running in
// lockstep without a point shows as a race.
#include "engine/backend/cuda/emulator/state.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace relgrad {
namespace cuda_emulator {

namespace {

// The lane a shuffling lane reads (-1: its own value, as CUDA gives past the warp's ends).
int shuffle_source(const Fiber& lane) {
    const int own = static_cast<int>(lane.linear % kWarpSize), operand = lane.shuffle_operand;
    switch (lane.shuffle_kind) {
        case ShuffleKind::index: return operand % kWarpSize;
        case ShuffleKind::up: return own - operand < 0 ? -1 : own - operand;
        case ShuffleKind::down: return own + operand >= kWarpSize ? -1 : own + operand;
        case ShuffleKind::xor_lanes: return own ^ operand;
        case ShuffleKind::none: break;
    }
    return -1;
}

// mma.sync for one warp whose 32 lanes all wait at it: A (16 x K), B (K x 8) and C (16 x 8)
// assembled from the lanes' fragments by the PTX ISA's layouts (mma.hpp), then each lane's
// D = A B + C elements written, summed in double and rounded to float once.
void multiply_accumulate(Fiber* const* lanes) {
    const MmaInputs inputs = lanes[0]->mma.inputs;
    double a[16][16], b[16][8], c[16][8];
    for (int lane = 0; lane < kWarpSize; ++lane) {
        const Fiber::MmaFragments& own = lanes[lane]->mma;
        for (int i = 0; i < mma_a_elements(inputs); ++i) {
            const TilePlace at = mma_a_place(inputs, lane, i);
            a[at.row][at.col] = mma_input(inputs, own.a, i);
        }
        for (int i = 0; i < mma_b_elements(inputs); ++i) {
            const TilePlace at = mma_b_place(inputs, lane, i);
            b[at.row][at.col] = mma_input(inputs, own.b, i);
        }
        for (int i = 0; i < 4; ++i) {
            const TilePlace at = mma_c_place(lane, i);
            c[at.row][at.col] = own.c[i];
        }
    }
    for (int lane = 0; lane < kWarpSize; ++lane) {  // after every C is read: a lane's d may be its c
        for (int i = 0; i < 4; ++i) {
            const TilePlace at = mma_c_place(lane, i);
            double sum = c[at.row][at.col];
            for (int k = 0; k < mma_k(inputs); ++k) sum += a[at.row][k] * b[k][at.col];
            lanes[lane]->mma.d[i] = static_cast<float>(sum);
        }
    }
}

// ldmatrix.m8n8.x4 of the warp's lanes: matrix m's row r is the 8 values at the address lane 8 m + r
// named; lane l gets in register m its row l / 4, columns 2 (l % 4) and + 1, or, transposed, its
// column l / 4, rows 2 (l % 4) and + 1 (the lower index in the low half).
void load_matrices(Fiber* const* lanes) {
    const bool transposed = lanes[0]->ldmatrix.transposed;
    for (int lane = 0; lane < kWarpSize; ++lane) {
        for (int m = 0; m < 4; ++m) {
            const auto value = [&](int row, int col) { return uint32_t{lanes[8 * m + row]->ldmatrix.row[col]}; };
            const int g = lane / 4, t = lane % 4;
            lanes[lane]->ldmatrix.out[m] =
                transposed ? value(2 * t, g) | value(2 * t + 1, g) << 16 : value(g, 2 * t) | value(g, 2 * t + 1) << 16;
        }
    }
}

}  // namespace

std::string lane_list(unsigned mask) {
    std::string out;
    for (int lane = 0; lane < kWarpSize; ++lane) {
        if (mask >> lane & 1u) out += (out.empty() ? "" : ", ") + std::to_string(lane);
    }
    return out;
}

// Lets every warp whose lanes of the mask all wait at the same warp point go on, with what each
// lane reads; returns whether one went on. A lane of the mask that is not there yet holds its warp.
// Lanes at one point with other masks or other operations, or a lane that reads a lane outside the
// mask, are errors (CUDA leaves them undefined): the lane throws when it goes on.
bool release_warps(Block& block) {
    bool released = false;
    const std::size_t threads = block.fibers.size();
    for (std::size_t first = 0; first < threads; first += kWarpSize) {
        Fiber* lanes[kWarpSize] = {};
        unsigned waiting = 0;
        for (std::size_t t = first; t < std::min(threads, first + kWarpSize); ++t) {
            lanes[t - first] = &block.fibers[t];
            if (block.fibers[t].state == Fiber::State::at_warp_point) waiting |= 1u << (t - first);
        }
        if (!waiting) continue;
        const Fiber& leader = *lanes[__builtin_ctz(waiting)];
        const unsigned mask = leader.warp_mask;
        if ((waiting & mask) != mask) continue;  // some lane of the mask is not there yet
        for (int lane = 0; lane < kWarpSize; ++lane) {
            if (!(mask >> lane & 1u)) continue;
            Fiber& fiber = *lanes[lane];
            fiber.warp_error.clear();
            if (fiber.warp_mask != mask || std::strcmp(fiber.warp_op, leader.warp_op) != 0) {
                fiber.warp_error = std::string(fiber.warp_op) + " with mask of lanes " + lane_list(fiber.warp_mask) +
                                   " met " + leader.warp_op + " with mask of lanes " + lane_list(mask) +
                                   " (the lanes of a mask must all call one operation with one mask)";
            } else if (fiber.shuffle_kind != ShuffleKind::none) {
                const int source = shuffle_source(fiber);
                if (source < 0) {
                    fiber.warp_result = fiber.warp_value;
                } else if (!(mask >> source & 1u)) {
                    fiber.warp_error = std::string(fiber.warp_op) + ": lane " + std::to_string(lane) + " reads lane " +
                                       std::to_string(source) + ", which is not in the mask (lanes " + lane_list(mask) +
                                       ")";
                } else {
                    fiber.warp_result = lanes[source]->warp_value;
                }
            }
            fiber.state = Fiber::State::runnable;
        }
        // Only __syncwarp orders the lanes' memory accesses (CUDA's memory model): a shuffle,
        // mma.sync and ldmatrix are convergence points, whose lanes may still see one another's
        // shared-memory writes in any order.
        if (std::strcmp(leader.warp_op, "__syncwarp") == 0) ++block.warp_epochs[first / kWarpSize];
        const bool agreed =
            std::none_of(lanes, lanes + kWarpSize, [&](const Fiber* f) { return f && !f->warp_error.empty(); });
        if (leader.mma.d && agreed) multiply_accumulate(lanes);
        if (leader.ldmatrix.out && agreed) load_matrices(lanes);
        released = true;
    }
    return released;
}

uint64_t warp_point(const char* op, unsigned mask, uint64_t value, ShuffleKind kind, int operand) {
    if (!running_block || !running_block->current) throw std::logic_error(std::string(op) + " outside a kernel");
    Fiber& lane = *running_block->current;
    const unsigned own = static_cast<unsigned>(lane.linear % kWarpSize);
    const std::size_t warp_start = lane.linear - own, threads = running_block->fibers.size();
    const std::size_t lanes = std::min<std::size_t>(threads - warp_start, kWarpSize);
    const unsigned exists = lanes == kWarpSize ? ~0u : (1u << lanes) - 1;
    if (!(mask >> own & 1u)) {
        throw std::logic_error(std::string(op) + ": lane " + std::to_string(own) + " is not in its own mask (lanes " +
                               lane_list(mask) + ")");
    }
    if (mask & ~exists) {
        throw std::logic_error(std::string(op) + ": the mask names lanes " + lane_list(mask & ~exists) +
                               ", which the block does not have");
    }
    if (kind == ShuffleKind::xor_lanes && (operand < 0 || operand >= kWarpSize)) {
        throw std::logic_error(std::string(op) + ": a lane mask of " + std::to_string(operand) + " (0 to 31)");
    }
    if ((kind == ShuffleKind::up || kind == ShuffleKind::down) && operand < 0) {
        throw std::logic_error(std::string(op) + ": a negative delta (" + std::to_string(operand) + ")");
    }
    lane.warp_op = op;
    lane.warp_mask = mask;
    lane.shuffle_kind = kind;
    lane.shuffle_operand = operand;
    lane.warp_value = value;
    lane.state = Fiber::State::at_warp_point;
    yield_to_scheduler(false);
    if (!lane.warp_error.empty()) throw std::logic_error(lane.warp_error);
    return lane.warp_result;
}

void mma_sync_point(MmaInputs inputs, float* d, const uint32_t* a, const uint32_t* b, const float* c) {
    const char* op = inputs == MmaInputs::tf32       ? "mma.sync.m16n8k8 (tf32)"
                     : inputs == MmaInputs::bfloat16 ? "mma.sync.m16n8k16 (bfloat16)"
                                                     : "mma.sync.m16n8k16 (float16)";
    if (!running_block || !running_block->current) throw std::logic_error(std::string(op) + " outside a kernel");
    Fiber& lane = *running_block->current;
    lane.mma = {inputs, a, b, c, d};
    struct Clear {  // the fragments are the lane's only while it waits
        Fiber& lane;
        ~Clear() { lane.mma = {}; }
    } clear{lane};
    warp_point(op, ~0u, 0, ShuffleKind::none, 0);  // all 32 lanes, as .aligned requires
}

void ldmatrix_point(bool transposed, const void* row, uint32_t* out) {
    // a name that is no string of the lane's own, which a failed launch, leaving the lane's stack
    // where it stands, would never free
    const char* const op = transposed ? "ldmatrix.sync.m8n8.x4.trans.shared.b16" : "ldmatrix.sync.m8n8.x4.shared.b16";
    if (!running_block || !running_block->current) throw std::logic_error(std::string(op) + " outside a kernel");
    Fiber& lane = *running_block->current;
    if (reinterpret_cast<uintptr_t>(row) % 16) {
        throw std::logic_error(std::string(op) + ": lane " + std::to_string(lane.linear % kWarpSize) +
                               " names a row that does not start at a 16-byte boundary");
    }
    note_shared_access(row, 16, false);  // also refuses a row outside the block's shared memory
    lane.ldmatrix = {transposed, static_cast<const uint16_t*>(row), out};
    struct Clear {  // the row and the registers are the lane's only while it waits
        Fiber& lane;
        ~Clear() { lane.ldmatrix = {}; }
    } clear{lane};
    warp_point(op, ~0u, 0, ShuffleKind::none, 0);  // all 32 lanes, as .aligned requires
}

}  // namespace cuda_emulator
}  // namespace relgrad

void __syncwarp(unsigned mask) {
    relgrad::cuda_emulator::warp_point("__syncwarp", mask, 0, relgrad::cuda_emulator::ShuffleKind::none, 0);
}
