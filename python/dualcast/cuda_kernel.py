"""dualcast.cuda_kernel: the CUDA kernel text of dualcast.jit's generated source (Spec.source(dtype,
"cuda")) and the host's choice of how a call walks it. The choice is plain Python over a call's
coalesced shape, strides and addresses, so that it is tested on a machine without a GPU
(tests/test_cuda_plan.py); dualcast.cuda turns it into a launch.

Two walks (32-bit index arithmetic is cheaper, and exact below 2^31 elements):

- fast (dualcast_jit_fast32), for calls of fewer than 2^31 elements (a 64-bit twin made NVRTC's
  compile of every function about 35% slower, for arrays of 8 GiB and more: those take the general
  walk): every input's last stride is 1 (it advances with the element) or 0
  (broadcast along the row), the common case after coalescing: one row (a contiguous or scalar
  call) or rows over blockIdx.y. A thread takes W consecutive elements (as many as one 16-byte vector
  of the compute type holds: 4 floats, 2 doubles), read through a row pointer per input with unit
  steps, and vector loads and stores where the host found every address and row start aligned
  (Args::vec). 16-bit storage (bfloat16, float16) computes in float, so it takes 4 lanes too, moved
  as one 8-byte vector of 16-bit values and converted in registers. An input broadcast along the row
  is read once per row. The body is evaluated once per element, on the same numbers in the same order
  as the general walk, so its results are the general walk's bit for bit.
- general (dualcast_jit_kernel32/64): anything else, one element per thread, each input through its
  own strides (rows over blockIdx.y when they fill half a block), with 32- or 64-bit indices.
"""

import collections

THREADS = 256                # threads per block
VECTOR_BYTES = 16            # one float4 / double2 of lanes (16-bit storage: half of it, a uint2)
FAST_BLOCKS_PER_SM = 8       # the fast walk's grid: enough blocks to fill the GPU, each then loops
GENERAL_BLOCKS_PER_SM = 16
MAX_FAST_INPUTS = 64         # Args::unit is a 64-bit mask
INDEX32_LIMIT = 2 ** 31      # fewer elements than this: the 32-bit entry points

Plan = collections.namedtuple("Plan", "n walk bits unit vec_strides grid vec_bytes")
Plan.__doc__ = """How one call shape runs: n elements; walk 'fast', 'rowwise' or 'flat' (the general
kernel's two walks); bits 32 or 64 (the entry point; the fast walk has only 32); unit: the mask of inputs whose last stride is
1 (fast walk); vec_strides: whether every row starts on a vector boundary in every unit input and in
the outputs (then the addresses alone decide, per call: vector_ok); grid (x, y); vec_bytes: the
size of one vector access, which every address it touches must be a multiple of (vector_bytes)."""


def lanes(itemsize):
    """Elements per thread in the fast walk: one 16-byte vector of the compute type, so 4 float32,
    2 float64, and 4 of a 16-bit type (computed in float: the kernel's W is 16 / sizeof(T))."""
    return VECTOR_BYTES // max(itemsize, 4)


def vector_bytes(itemsize):
    """Bytes of one vector load or store in the fast walk (W elements of storage): 16, and 8 for the
    16-bit types (a uint2 of 4 lanes)."""
    return lanes(itemsize) * itemsize


def index_bits(n):
    """The entry point for n elements: every index and a grid stride past it fit a uint32 below 2^31."""
    return 32 if n < INDEX32_LIMIT else 64


def plan(shape, in_strides, itemsize, sms, fast=True, fast_blocks_per_sm=None):
    """The Plan of a coalesced call (jit.coalesce's shape and per-input strides, in elements), or None
    when it has no element. sms: the GPU's multiprocessor count; fast=False: the general walk even
    where the fast one applies (to compare the two); fast_blocks_per_sm: how many blocks of the fast
    entry point fit on a multiprocessor at once (the driver's occupancy, from its registers): the
    grid is then one wave of resident blocks, each looping, rather than blocks that wait."""
    n = 1
    for size in shape:
        n *= size
    if n == 0:
        return None
    nd, w = len(shape), lanes(itemsize)
    cols = shape[-1] if nd else 1
    rows = n // cols
    inner = [st[-1] if nd else 0 for st in in_strides]
    tile = THREADS * w
    # Short rows would leave most of a fast block idle: the general walk's flat grid covers them.
    if (fast and nd >= 1 and n < INDEX32_LIMIT and all(s in (0, 1) for s in inner) and len(in_strides) <= MAX_FAST_INPUTS
            and (nd == 1 or cols >= tile // 2)):
        unit = sum(1 << k for k, s in enumerate(inner) if s == 1)
        # A row starts at row * cols in the outputs and at sum_d i_d * stride_d in a unit input: both
        # must stay multiples of w, or no row but the first is aligned. (One row: its tail is
        # handled element by element.)
        vec_strides = nd == 1 or (cols % w == 0 and all(
            s % w == 0 for k, st in enumerate(in_strides) if unit >> k & 1 for s in st[:-1]))
        cap = sms * max(1, min(fast_blocks_per_sm or FAST_BLOCKS_PER_SM, FAST_BLOCKS_PER_SM))
        gx = min(-(-cols // tile), cap)
        gy = min(rows, max(1, cap // gx), 65535)
        return Plan(n, "fast", 32, unit, vec_strides, (gx, gy), vector_bytes(itemsize))
    cap = sms * GENERAL_BLOCKS_PER_SM
    if nd >= 2 and cols >= THREADS // 2:  # rows of at least half a block: one decomposition per row
        gx = min(-(-cols // THREADS), cap)
        return Plan(n, "rowwise", index_bits(n), 0, False, (gx, min(rows, max(1, cap // gx), 65535)), 0)
    return Plan(n, "flat", index_bits(n), 0, False, (min(-(-n // THREADS), cap), 1), 0)


def vector_ok(p, inputs, outputs, partials):
    """Whether this call of Plan p may use vector loads and stores: the plan's strides allow them and
    every address they touch (the unit inputs', the outputs' and the wanted partials') is a multiple
    of p.vec_bytes (16, or 8 for 16-bit storage). Per call: the same shape can come with a view that
    starts mid-vector (x[:, 1:], or x[1:] of a bfloat16 tensor, 2 bytes in)."""
    if p is None or p.walk != "fast" or not p.vec_strides:
        return False
    bits = 0
    for k, addr in enumerate(inputs):
        if p.unit >> k & 1:
            bits |= addr
    for addr in outputs:
        bits |= addr or 0
    for addr in partials:
        bits |= addr or 0
    return bits % p.vec_bytes == 0


# What a fast chunk stores: the rows of W lanes that jit's tile_keep filled (the same arrays as the
# CPU tiles', in the compute type T), to the row's contiguous outputs (storage type S) at element
# first + c. (Plain text, not format strings: they are a format field's value.)
TILE_STORES = {
    "dual": """\
#pragma unroll
        for (int m = 0; m < M; ++m) {
          store_lanes(OUTP(a.out, m) + first + c, r[m][0], vec);
#pragma unroll
          for (int j = 0; j < K; ++j)
            if (S* q = OUTP(a.partials, m * K + j)) store_lanes(q + first + c, r[m][1 + j], vec);
        }""",
    "values": """\
#pragma unroll
        for (int m = 0; m < M; ++m) store_lanes(OUTP(a.out, m) + first + c, r[m], vec);""",
    "gradient": """\
#pragma unroll
        for (int j = 0; j < K; ++j)
          if (S* q = OUTP(a.out, j)) store_lanes(q + first + c, r[j], vec);""",
}

# The general walk: one thread per output element, grid-stride. A call of rows long enough to fill a
# block (rowwise) walks rows (every dimension but the last) over blockIdx.y and each row's elements
# over x: a row's input offsets come from one index decomposition and its elements add the last
# stride, so no element divides. Otherwise one flat walk. The arguments travel by value.
KERNEL = r"""
namespace {{
struct Args {{
  std::int64_t n, ndim, rowwise;
  std::uint64_t unit;                    // fast walk: bit k set where input k's last stride is 1 (else 0)
  std::int64_t vec;                      // fast walk: vector loads and stores (the host checked alignment)
  std::int64_t shape[MAXDIM];
  const void* in[NIN];
  std::int64_t in_strides[NIN][MAXDIM];  // in elements
  void* out[NOUT];
  void* partials[NPART];                 // null: not wanted
}};

template <class I>
__device__ __forceinline__ void element(const Args& a, const std::int64_t (&o)[NIN], I e) {{
{loads}
    const Ret res = user_body({args});
{store}
}}

// Each input's offset at the first element of row r (every dimension but the last, decomposed once
// per row): shared by the rowwise and the fast walk.
template <class I>
__device__ void row_base(const Args& a, I r, std::int64_t* base) {{
  for (int k = 0; k < NIN; ++k) base[k] = 0;
  for (int d = static_cast<int>(a.ndim) - 2; d >= 0; --d) {{
    const I size = static_cast<I>(a.shape[d]);
    const I i = r % size;
    r /= size;
    for (int k = 0; k < NIN; ++k) base[k] += static_cast<std::int64_t>(i) * a.in_strides[k][d];
  }}
}}

template <class I>
__device__ void run(const Args& a) {{
  const int nd = static_cast<int>(a.ndim);
  if (a.rowwise) {{
    const I cols = static_cast<I>(a.shape[nd - 1]);
    const I rows = static_cast<I>(a.n) / cols;
    for (I r = blockIdx.y; r < rows; r += gridDim.y) {{
      std::int64_t base[NIN];
      row_base<I>(a, r, base);
      for (I c = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols; c += static_cast<I>(gridDim.x) * blockDim.x) {{
        std::int64_t o[NIN];
        for (int k = 0; k < NIN; ++k) o[k] = base[k] + static_cast<std::int64_t>(c) * a.in_strides[k][nd - 1];
        element<I>(a, o, r * cols + c);
      }}
    }}
    return;
  }}
  const I n = static_cast<I>(a.n);
  for (I e = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += static_cast<I>(gridDim.x) * blockDim.x) {{
    std::int64_t o[NIN] = {{}};
    if (nd == 1) {{
      for (int k = 0; k < NIN; ++k) o[k] = static_cast<std::int64_t>(e) * a.in_strides[k][0];
    }} else {{
      I rest = e;
      for (int d = nd - 1; d >= 0; --d) {{
        const I size = static_cast<I>(a.shape[d]);
        const I i = rest % size;
        rest /= size;
        for (int k = 0; k < NIN; ++k) o[k] += static_cast<std::int64_t>(i) * a.in_strides[k][d];
      }}
    }}
    element<I>(a, o, e);
  }}
}}

// ---- the fast walk (cuda_kernel.py's docstring) ----
constexpr int W = 16 / static_cast<int>(sizeof(T));  // lanes per thread: one 16-byte vector of T

// The inputs are never written during a launch (the outputs are other tensors): read-only loads.
__device__ __forceinline__ void load_lanes(const float* p, float (&x)[4], bool vec) {{
  if (vec) {{
    const float4 v = __ldg(reinterpret_cast<const float4*>(p));
    x[0] = v.x; x[1] = v.y; x[2] = v.z; x[3] = v.w;
  }} else {{
#pragma unroll
    for (int e = 0; e < 4; ++e) x[e] = __ldg(p + e);
  }}
}}
__device__ __forceinline__ void load_lanes(const double* p, double (&x)[2], bool vec) {{
  if (vec) {{
    const double2 v = __ldg(reinterpret_cast<const double2*>(p));
    x[0] = v.x; x[1] = v.y;
  }} else {{
    x[0] = __ldg(p); x[1] = __ldg(p + 1);
  }}
}}
__device__ __forceinline__ void store_lanes(float* q, const float (&x)[4], bool vec) {{
  if (vec) {{
    *reinterpret_cast<float4*>(q) = make_float4(x[0], x[1], x[2], x[3]);
  }} else {{
#pragma unroll
    for (int e = 0; e < 4; ++e) q[e] = x[e];
  }}
}}
__device__ __forceinline__ void store_lanes(double* q, const double (&x)[2], bool vec) {{
  if (vec) {{
    *reinterpret_cast<double2*>(q) = make_double2(x[0], x[1]);
  }} else {{
    q[0] = x[0]; q[1] = x[1];
  }}
}}
__device__ __forceinline__ float load_one(const float* p) {{ return __ldg(p); }}
__device__ __forceinline__ double load_one(const double* p) {{ return __ldg(p); }}

// 16-bit storage (half.hpp's bfloat16 and float16, H): W = 4 float lanes are 8 bytes, one uint2,
// little-endian (element e in bits 16 * (e % 2) of word e / 2); each value becomes a float on load
// and is rounded once on store by half.hpp's conversions, as in the general walk's T(...) and S(...).
// Templates: a float or double kernel has no half.hpp and instantiates none of them.
template <class H, std::enable_if_t<sizeof(H) == 2, int> = 0>
__device__ __forceinline__ float load_one(const H* p) {{
  return static_cast<float>(H::from_bits(__ldg(reinterpret_cast<const unsigned short*>(p))));
}}
template <class H, std::enable_if_t<sizeof(H) == 2, int> = 0>
__device__ __forceinline__ void load_lanes(const H* p, float (&x)[4], bool vec) {{
  unsigned short b[4];
  if (vec) {{
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
    b[0] = static_cast<unsigned short>(v.x); b[1] = static_cast<unsigned short>(v.x >> 16);
    b[2] = static_cast<unsigned short>(v.y); b[3] = static_cast<unsigned short>(v.y >> 16);
  }} else {{
#pragma unroll
    for (int e = 0; e < 4; ++e) b[e] = __ldg(reinterpret_cast<const unsigned short*>(p + e));
  }}
#pragma unroll
  for (int e = 0; e < 4; ++e) x[e] = static_cast<float>(H::from_bits(b[e]));
}}
template <class H, std::enable_if_t<sizeof(H) == 2, int> = 0>
__device__ __forceinline__ void store_lanes(H* q, const float (&x)[4], bool vec) {{
  unsigned b[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) b[e] = H(x[e]).bits;
  if (vec) {{
    *reinterpret_cast<uint2*>(q) = make_uint2(b[0] | b[1] << 16, b[2] | b[3] << 16);
  }} else {{
#pragma unroll
    for (int e = 0; e < 4; ++e) q[e] = H::from_bits(static_cast<unsigned short>(b[e]));
  }}
}}

template <class I>
__device__ void run_fast(const Args& a) {{
  const int nd = static_cast<int>(a.ndim);
  const I cols = static_cast<I>(a.shape[nd - 1]);
  const I rows = static_cast<I>(a.n) / cols;
  const std::uint64_t unit = a.unit;
  const bool vec = a.vec != 0;
  const I step = static_cast<I>(gridDim.x) * blockDim.x * W;
  for (I row = blockIdx.y; row < rows; row += gridDim.y) {{
    const S* p[NIN];  // each input at the row's first element
    T bc[NIN];        // an input broadcast along the row: its one value, read once per row
    {{
      std::int64_t base[NIN];
      row_base<I>(a, row, base);
#pragma unroll
      for (int k = 0; k < NIN; ++k) {{
        p[k] = static_cast<const S*>(a.in[k]) + base[k];
        bc[k] = (unit >> k & 1) ? T(0) : load_one(p[k]);
      }}
    }}
    const I first = row * cols;  // the row's first output element
    for (I c = (static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x) * W; c < cols; c += step) {{
      if (c + W <= cols) {{
        T xs[NIN][W];
#pragma unroll
        for (int k = 0; k < NIN; ++k) {{
          if (unit >> k & 1) {{
            load_lanes(p[k] + c, xs[k], vec);
          }} else {{
#pragma unroll
            for (int e = 0; e < W; ++e) xs[k][e] = bc[k];
          }}
        }}
{tile_result}
#pragma unroll
        for (int e = 0; e < W; ++e) {{
{tile_loads}
          const Ret res = user_body({args});
{tile_keep}
        }}
{tile_store}
      }} else {{
        // A row's last elements when its length is not a multiple of W (only one row has them
        // when vec is on: the host allows vectors on several rows only when they are whole).
#pragma unroll 1
        for (I e = c; e < cols; ++e) {{
          std::int64_t o[NIN];
          for (int k = 0; k < NIN; ++k)
            o[k] = (p[k] - static_cast<const S*>(a.in[k])) + ((unit >> k & 1) ? static_cast<std::int64_t>(e) : 0);
          element<I>(a, o, first + e);
        }}
      }}
    }}
  }}
}}
}}  // namespace

extern "C" __global__ void dualcast_jit_kernel32(const Args a) {{ run<std::uint32_t>(a); }}
extern "C" __global__ void dualcast_jit_kernel64(const Args a) {{ run<std::int64_t>(a); }}
extern "C" __global__ void __launch_bounds__({threads}) dualcast_jit_fast32(const Args a) {{ run_fast<std::uint32_t>(a); }}
"""
