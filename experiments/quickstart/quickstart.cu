// quickstart.cu: the README's quick start, exactly as a user writes it. Runs on the GPU when one is
// present, else on the CPU; registered as a ctest so it keeps compiling and running.
#include <dualcast/dualcast.hpp>
#include <cstdio>
using namespace dualcast;

// The HM-LSTM cell update, written once for numbers, duals, CPU and GPU.
struct HmlstmUpdate {
  DUALCAST_HD auto operator()(auto z, auto zb, auto c, auto f, auto i, auto g) const {
    if (z == 1) return sigmoid(i) * tanh(g);          // FLUSH
    if (zb == 0) return c;                            // COPY
    return sigmoid(f) * c + sigmoid(i) * tanh(g);     // UPDATE
  }
};

int main() {
  Device dev = cuda_available() ? Device::cuda() : Device::cpu();
  const int B = 512, H = 1024;
  Var c = Var::param(Tensor::randn({B, H}, dev, 1));
  Var f = Var::param(Tensor::randn({B, H}, dev, 2));
  Var i = Var::param(Tensor::randn({B, H}, dev, 3));
  Var g = Var::param(Tensor::randn({B, H}, dev, 4));
  Tensor z  = Tensor::bernoulli({B, 1}, 0.3, dev, 5);  // per-row flags: constants, not differentiated
  Tensor zb = Tensor::bernoulli({B, 1}, 0.5, dev, 6);

  Var c_new = broadcast(HmlstmUpdate{}, z, zb, c, f, i, g);  // K = 4: one partial per Var argument

  using D = Dual<float, 4>;                                    // the same function as a lambda over duals
  Var c_lam = broadcast([] DUALCAST_HD (float z, float zb, D c, D f, D i, D g) {
    if (z == 1) return sigmoid(i) * tanh(g);
    if (zb == 0) return c;
    return sigmoid(f) * c + sigmoid(i) * tanh(g);
  }, z, zb, c, f, i, g);

  Var loss = sum(c_new * c_new) + sum(c_lam);
  loss.backward();
  std::printf("loss %.6g  |dc| %.6g  |df| %.6g\n", loss.item(), norm(c.grad()), norm(f.grad()));
}
