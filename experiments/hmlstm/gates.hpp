// gates.hpp: the gate pre-activations of one HM-LSTM layer over T time steps, with the weight
// gradient of all T steps computed as ONE matrix product after the time loop.
//
// Per step t the layer's gates are s_t = [zb*h_below, h, z*h_above, 1, 0, 0, 0] @ Wcat with
// Wcat = [W; U; Td; b; 0; 0; 0] (the bias is a row of the product; three zero rows pad the inner
// dimension to a multiple of 4), split into f, i, o, g (H each) and s_z (1). For the top layer the
// h_above block (and Td) is absent. At t = 0 h and h_above are the zero state, so their blocks are zero.
//
// The tape (rule 5: a node holds what its backward needs; its backward only accumulates):
//  * a StackNode per layer, created before the time loop, owns the layer's stacks X [T*B, K] (the
//    gate inputs of every step) and dS [T*B, G] (the gate adjoints of every step). Its output `w` is
//    Wcat's value on a node of its own, the weight every step reads. Created first, it runs last in
//    backward (nodes run by decreasing creation order): dWcat = X^T dS, one product with inner
//    dimension T*B instead of T products with inner dimension B (the skinny products that dominated
//    the step), which also yields db (the bias row) without a per-step reduction.
//  * a GateNode per step writes its gate inputs straight into block t of X (one kernel: the row
//    scalings by the flags and the concatenation), multiplies, and splits s_t into the five gates.
//    Backward packs the five gate adjoints into block t of dS (one kernel), computes the input
//    adjoint dX_t = dS_t Wcat^T (one product) and from it the gradients of h_below, zb, h, z and
//    h_above (one kernel; the two flag gradients are row sums).
// Versus one matmul node per step plus the flag products, the concatenation, the bias add and the
// split: the same values and gradients (tests: StackedGatesEqualThePerStepProducts), about a third
// of the kernels, and 2 instead of 3 products per layer and step.
//
// In mixed mode (recomputed partials) cell_step() goes one further: a FusedCellNode also evaluates the
// cell (HmCell) and the boundary detector (BoundarySte / BoundarySoft) on the product, plain numbers
// forward and dual numbers backward, in one kernel each way, so a layer-step is 3 kernels forward
// (gate inputs, product, cell) and 3 backward (cell, product, gate inputs) instead of 5 and 5 (the
// split, the two broadcasts and the adjoint packing are gone; tests: FusedCellStep*). Given the next
// layer-step's inputs (NextInputs), its kernel also writes that step's gate inputs into the other
// layer's stack, so the next step runs no gate-input kernel: 2 kernels per layer-step forward. The
// next step checks that it is called with the inputs that were written, and packs them itself if not.
//
// Under Autocast (a float32 layer built while an Autocast guard is active) every product of the layer
// rounds its operands to the autocast dtype and sums in float32 (matmul_rounded, ops/linalg.hpp):
// the gate products read Wcat^T rounded once per forward (made in the constructor) and write float32
// gates, so the cell kernels, the states and every gradient stay float32, as do the master weights.
// The two stacks, X and dS, are kept in the autocast dtype (the products would round them anyway)
// with rows padded to 16 bytes by zero columns (Wcat^T gets the matching zero rows and columns):
// both operands of every gate product are then 16-bit and 16-byte aligned, which the skinny kernel
// reads with 16-byte copies and ldmatrix and cuBLAS without a conversion pass. The per-step products
// have M = B rows: matmul_rounded runs them on its split-K tensor-core kernel where that measures
// faster than cuBLAS (tests: AutocastStep*).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"

namespace hmlstm {

/// Wcat = [W; U; Td; b; 0; 0; 0] (Td may be undefined: the top layer), a Var on the tape (the
/// concatenation's backward hands each parameter its rows).
dualcast::Var stacked_gate_weights(const dualcast::Var& W, const dualcast::Var& U, const dualcast::Var& Td,
                                   const dualcast::Var& b);

class LayerGates;

/// Another layer-step's gate inputs, for cell_step to write in its own kernel (see the file comment).
/// from_this_cell: the bottom-up input and its multiplier are this cell's h' and z' (the next layer,
/// same step); otherwise they are `below` and `zb` (undefined: 1). h, z, h_above as in step().
struct NextInputs {
  LayerGates* layer = nullptr;  // null: none
  std::int64_t t = 0;
  bool from_this_cell = false;
  dualcast::Var below, zb, h, z, h_above;
};

/// One layer's gate products for steps 0..T-1 over batches of B rows (see the file comment).
class LayerGates {
 public:
  /// wcat: stacked_gate_weights(...) of this layer, [K, 4H+1]; has_above: whether the layer reads the
  /// layer above (h_above, z). Creates the layer's StackNode (call before the time loop).
  LayerGates(const dualcast::Var& wcat, std::int64_t T, std::int64_t B, std::int64_t H, bool has_above);
  /// f, i, o, g, s_z of step t (0 <= t < T, each step once, in order). zb: [B,1] multiplier of
  /// h_below (undefined: 1); z: [B,1] multiplier of h_above (ignored without has_above).
  std::vector<dualcast::Var> step(std::int64_t t, const dualcast::Var& below, const dualcast::Var& zb,
                                  const dualcast::Var& h, const dualcast::Var& z,
                                  const dualcast::Var& h_above);

  /// Mixed mode, fused (recomputed partials): step t's gates as step() computes them, and on them the
  /// cell HmCell (flags zflag = z^l_{t-1} and zbflag = zb, undefined: 1; state c, h) and the
  /// boundary detector (BoundarySte, or BoundarySoft when soft; slope [1, 1] on the device), inside
  /// one node: returns (c', h', z'). Forward: gate inputs, product, one kernel for the cell and the
  /// boundary on plain numbers. Backward: one kernel evaluates both again on dual numbers and writes
  /// the gate adjoints straight into the stack (and c's and h's gradients), then the product and the
  /// gate inputs' kernel. 3 kernels each way instead of the 5 of step() + two broadcasts. With
  /// `next`, the forward kernel also writes next.layer's gate inputs of step next.t (file comment):
  /// only while gradients are recorded, into a layer of the same dtype and device.
  std::vector<dualcast::Var> cell_step(std::int64_t t, const dualcast::Var& below, const dualcast::Var& zb,
                                       const dualcast::Var& h, const dualcast::Var& z,
                                       const dualcast::Var& h_above, const dualcast::Var& c,
                                       const dualcast::Tensor& zflag, const dualcast::Tensor& zbflag,
                                       const dualcast::Tensor& slope, bool soft, const NextInputs& next = {});

  struct Stack;

 private:
  /// Step t's gate product s [B, G] and the input values a gate node keeps (zb, z, above undefined
  /// where the layer has none).
  struct StepValues {
    dualcast::Tensor s, below, zb, z, above;
  };
  /// Checks the inputs, writes step t's gate inputs into the stack (or a fresh buffer; not when an
  /// earlier cell_step wrote these very inputs already) and multiplies.
  StepValues products(std::int64_t t, const dualcast::Var& below, const dualcast::Var& zb, const dualcast::Var& h,
                      const dualcast::Var& z, const dualcast::Var& h_above);

  std::shared_ptr<Stack> stack_;
  dualcast::Var w_;  // the StackNode's output: Wcat's value
  dualcast::DType low_ = dualcast::DType::float32;  // the autocast dtype of the products (float32: none)
  dualcast::DType xtype_ = dualcast::DType::float32;  // the gate-input stack's dtype (gates.cu, Stack::x)
  dualcast::Tensor wlow_;  // Wcat^T in low_ (under Autocast): [Gs, K], zero rows past G (gates.cu, Stack::ds)
  std::int64_t T_, B_, H_;
  bool has_above_;
};

}  // namespace hmlstm
