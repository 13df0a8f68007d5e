"""The Triton kernels of the fused softcapped cross-entropy (softcap_ce.py explains the math and the
contract): the forward (per-row loss and log-sum-exp), the backward (the logits' gradient), and the
e5m2 gradient with its transpose for the FP8 head (a general kernel and the f16 one for sm_89+).
softcap_ce_launch.py launches them; without Triton this module defines nothing but the constants."""

from __future__ import annotations

from .triton_support import HAVE_TRITON, tl, triton

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
FIXED_MAX_CAP = 40.0  # caps up to this use the max-free log-sum-exp (softcap_ce.py's docstring)
TANH_MODES = {"exp": 0, "libdevice": 1, "approx": 2}


# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------

if HAVE_TRITON:
    try:
        from triton.language.extra import libdevice as _libdevice
    except Exception:  # pragma: no cover
        _libdevice = None

    @triton.jit
    def _capped_log2(x, cap, HAS_CAP: tl.constexpr, TANH: tl.constexpr):
        """(z * log2(e), tanh(x / cap)) with z = cap * tanh(x / cap) in fp32 (t unused without a cap).
        TANH: 0 exp formula (default), 1 libdevice tanhf, 2 tanh.approx.f32 (GPU only; ~2^-11
        relative error, i.e. up to ~7e-3 absolute in z at cap 15: less accurate than the fp32 reference)."""
        if HAS_CAP:
            if TANH == 1:
                t = _libdevice.tanh(x / cap)
            elif TANH == 2:
                t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x / cap],
                                              dtype=tl.float32, is_pure=True, pack=1)
            else:
                # tanh(y) = 1 - 2 / (exp(2y) + 1); exp(2y) = exp2(x * 2 log2(e) / cap).
                # exp2 -> inf for large x gives t = 1, exp2 -> 0 gives t = -1: no NaN.
                e = tl.exp2(x * (2.0 * 1.4426950408889634 / cap))
                t = 1.0 - tl.fdiv(2.0, e + 1.0)
            z2 = t * (cap * 1.4426950408889634)
        else:
            t = x
            z2 = x * 1.4426950408889634
        return z2, t

    @triton.jit
    def _mapped_log2(x, cap, a, b, HAS_CAP: tl.constexpr, AFFINE: tl.constexpr, TANH: tl.constexpr):
        """_capped_log2 of the logits' affine map a * x + b (AFFINE), else of x itself. dz/dx is a times
        the capped derivative: the callers fold a into their per-row gradient scale."""
        if AFFINE:
            x = x * a + b
        return _capped_log2(x, cap, HAS_CAP, TANH)

    @triton.jit
    def _target_logit(x_row, t_ptr, V, cap, a, b, ignore_index, HAS_CAP: tl.constexpr, AFFINE: tl.constexpr,
                      TANH: tl.constexpr):
        """(whether the target at t_ptr is valid, its capped logit z; 0 for a target outside [0, V))."""
        tgt = tl.load(t_ptr).to(tl.int64)
        valid = tgt != ignore_index
        in_range = valid & (tgt >= 0) & (tgt < V)
        xt = tl.load(x_row + tl.where(in_range, tgt, 0)).to(tl.float32)
        zt2, _tt = _mapped_log2(xt, cap, a, b, HAS_CAP, AFFINE, TANH)
        return valid, tl.where(in_range, zt2 * 0.6931471805599453, 0.0)

    @triton.jit
    def _softcap_ce_fwd_kernel(
        X, stride_x, T, W, LOSS, LSE, V, cap, a, b, ignore_index,
        HAS_CAP: tl.constexpr, FIXED_MAX: tl.constexpr, TANH: tl.constexpr, AFFINE: tl.constexpr,
        K: tl.constexpr, HAS_W: tl.constexpr, BLOCK_V: tl.constexpr,
    ):
        """One row's loss and logsumexp. T holds K targets per row (row-major) and W their K weights
        (HAS_W); without weights K is 1 and the row's loss is the plain cross-entropy."""
        row = tl.program_id(0).to(tl.int64)
        x_row = X + row * stride_x
        offs = tl.arange(0, BLOCK_V)
        if FIXED_MAX:
            # capped logits <= cap: exp2(z2 - c2) in [2^-2c2, 1]; accumulate per lane, reduce once.
            c2 = cap * 1.4426950408889634
            acc = tl.zeros([BLOCK_V], dtype=tl.float32)
            for start in range(0, V, BLOCK_V):
                cols = start + offs
                mask = cols < V
                x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
                z2, _t = _mapped_log2(x, cap, a, b, HAS_CAP, AFFINE, TANH)
                acc += tl.where(mask, tl.exp2(z2 - c2), 0.0)
            lse2 = c2 + tl.log2(tl.sum(acc, axis=0))
        else:
            # online max per chunk (log2 domain)
            m = tl.full((), float("-inf"), tl.float32)
            s = tl.full((), 0.0, tl.float32)
            for start in range(0, V, BLOCK_V):
                cols = start + offs
                mask = cols < V
                x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
                z2, _t = _mapped_log2(x, cap, a, b, HAS_CAP, AFFINE, TANH)
                z2 = tl.where(mask, z2, -float("inf"))
                m_new = tl.maximum(m, tl.max(z2, axis=0))
                s = s * tl.exp2(m - m_new) + tl.sum(tl.exp2(z2 - m_new), axis=0)
                m = m_new
            lse2 = m + tl.log2(s)
        lse = lse2 * 0.6931471805599453
        if HAS_W:  # sum_k w_k (lse - z_t_k) over the row's valid targets
            loss = tl.full((), 0.0, tl.float32)
            for k in tl.static_range(K):
                valid, zt = _target_logit(x_row, T + row * K + k, V, cap, a, b, ignore_index, HAS_CAP, AFFINE, TANH)
                loss += tl.where(valid, tl.load(W + k) * (lse - zt), 0.0)
        else:
            valid, zt = _target_logit(x_row, T + row, V, cap, a, b, ignore_index, HAS_CAP, AFFINE, TANH)
            loss = tl.where(valid, lse - zt, 0.0)
        tl.store(LOSS + row, loss)
        tl.store(LSE + row, lse)

    @triton.jit
    def _target_weights(T, W, rows, ignore_index, K: tl.constexpr, k: tl.constexpr, EVEN: tl.constexpr):
        """(target k of each of `rows` (int32), its weight there: w_k, or 0 where invalid). Unless EVEN, a
        row index < 0 (the caller's mark for a row past the end of a partial tile) reads as ignored."""
        if EVEN:
            tgt = tl.load(T + rows * K + k).to(tl.int32)
        else:
            tgt = tl.load(T + rows * K + k, mask=rows >= 0, other=ignore_index).to(tl.int32)
        return tgt, tl.where(tgt != ignore_index, tl.load(W + k), 0.0)

    @triton.jit
    def _softcap_ce_bwd_kernel(
        X, stride_x, G, stride_g, T, W, LSE, DLOSS, stride_dloss, V, cap, a, b, ignore_index,
        HAS_CAP: tl.constexpr, TANH: tl.constexpr, AFFINE: tl.constexpr, K: tl.constexpr, HAS_W: tl.constexpr,
        BLOCK_V: tl.constexpr,
    ):
        """dloss_i * dloss_i/dx_ij for one row; with K weighted targets
        dloss_i/dz_ij = Wv_i p_ij - sum_k w_k [j == t_ik], Wv_i the sum of the row's valid weights."""
        # G may alias X (in-place): each chunk is fully read before it is written, by one program.
        row = tl.program_id(0).to(tl.int64)
        x_row = X + row * stride_x
        g_row = G + row * stride_g
        if HAS_W:
            scale = tl.load(DLOSS + row * stride_dloss).to(tl.float32)
            wv = tl.full((), 0.0, tl.float32)
            for k in tl.static_range(K):
                wv += tl.where(tl.load(T + row * K + k) != ignore_index, tl.load(W + k), 0.0)
        else:
            tgt = tl.load(T + row).to(tl.int64)
            scale = tl.load(DLOSS + row * stride_dloss).to(tl.float32)
            scale = tl.where(tgt != ignore_index, scale, 0.0)
        if AFFINE:
            scale = scale * a
        lse2 = tl.load(LSE + row) * 1.4426950408889634
        offs = tl.arange(0, BLOCK_V)
        for start in range(0, V, BLOCK_V):
            cols = start + offs
            mask = cols < V
            # masked lanes: -inf gives p = 0 (0.0 could overflow exp2 for a very negative lse)
            x = tl.load(x_row + cols, mask=mask, other=float("-inf"), eviction_policy="evict_first").to(tl.float32)
            z2, t = _mapped_log2(x, cap, a, b, HAS_CAP, AFFINE, TANH)
            p = tl.exp2(z2 - lse2)
            if HAS_W:
                d = p * wv
                for k in tl.static_range(K):  # the same K scalar loads each chunk: cached
                    tgt_k = tl.load(T + row * K + k).to(tl.int64)
                    d -= tl.where(cols == tgt_k, tl.where(tgt_k != ignore_index, tl.load(W + k), 0.0), 0.0)
            else:
                d = p - tl.where(cols == tgt, 1.0, 0.0)
            if HAS_CAP:
                d = d * (1.0 - t * t)
            # fp32 -> bf16 rounds to nearest even on the GPU (the interpreter truncates: 2x the error)
            tl.store(g_row + cols, (d * scale).to(G.dtype.element_ty), mask=mask)


    @triton.jit
    def _softcap_ce_fp8_grad_kernel(
        X, stride_x, T, W, LSE, G, GT, N, V, cap, a, b, g_scale, ignore_index,
        HAS_CAP: tl.constexpr, TANH: tl.constexpr, AFFINE: tl.constexpr, K: tl.constexpr, HAS_W: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, EVEN: tl.constexpr,
    ):
        """g_scale * dloss_i/dx_ij for one (BLOCK_N x BLOCK_V) tile, given the rows' logsumexp, written
        in e5m2 twice: row-major into G (N, V) and transposed into GT (V, N), the two layouts the FP8
        backward matmuls want (model/fp8_head.py). One tile per program. 64-bit tile bases, 32-bit offsets
        inside the tile (the host checks they fit). The general version (any shape, the interpreter);
        _softcap_ce_fp8_grad_fast_kernel is the GPU's. With weights (HAS_W), K targets per row as in the
        backward kernel. The affine map's factor a is in g_scale (the host's)."""
        row0 = tl.program_id(0) * BLOCK_N
        col0 = tl.program_id(1) * BLOCK_V
        r = tl.arange(0, BLOCK_N)
        c = tl.arange(0, BLOCK_V)
        x_ptrs = X + row0.to(tl.int64) * stride_x + col0 + (r[:, None] * stride_x + c[None, :])
        g_ptrs = G + row0.to(tl.int64) * V + col0 + (r[:, None] * V + c[None, :])
        gt_ptrs = GT + col0.to(tl.int64) * N + row0 + (c[None, :] * N + r[:, None])
        if EVEN:
            x = tl.load(x_ptrs)
            if not HAS_W:
                tgt = tl.load(T + row0 + r).to(tl.int32)
            lse = tl.load(LSE + row0 + r)
        else:
            row_ok = (row0 + r) < N
            mask = row_ok[:, None] & ((col0 + c) < V)[None, :]
            x = tl.load(x_ptrs, mask=mask, other=0.0)
            if not HAS_W:
                tgt = tl.load(T + row0 + r, mask=row_ok, other=ignore_index).to(tl.int32)
            lse = tl.load(LSE + row0 + r, mask=row_ok, other=0.0)
        z2, t = _mapped_log2(x.to(tl.float32), cap, a, b, HAS_CAP, AFFINE, TANH)
        d = tl.exp2(z2 - (lse * 1.4426950408889634)[:, None])
        if HAS_W:
            rows = tl.where((row0 + r) < N, row0 + r, -1)  # -1: past the end (EVEN: none is)
            wv = tl.zeros([BLOCK_N], dtype=tl.float32)
            hits = tl.zeros([BLOCK_N, BLOCK_V], dtype=tl.float32)
            for k in tl.static_range(K):
                tgt_k, w_k = _target_weights(T, W, rows, ignore_index, K, k, EVEN)
                wv += w_k
                hits += tl.where(c[None, :] == (tgt_k - col0)[:, None], w_k[:, None], 0.0)
            d = d * wv[:, None] - hits
        else:
            d = d - tl.where(c[None, :] == (tgt - col0)[:, None], 1.0, 0.0)  # ignored rows are zeroed below
        if HAS_CAP:
            d = d * (1.0 - t * t)
        if HAS_W:
            d = (d * g_scale).to(G.dtype.element_ty)
        else:
            d = (d * tl.where(tgt != ignore_index, g_scale, 0.0)[:, None]).to(G.dtype.element_ty)
        # GT's store is contiguous along the tile's rows; the compiler recomputes the tile in that
        # layout (twice the math), which keeps 8-bit values out of a layout change (see the fast kernel)
        if EVEN:
            tl.store(g_ptrs, d)
            tl.store(gt_ptrs, d)
        else:
            tl.store(g_ptrs, d, mask=mask)
            tl.store(gt_ptrs, d, mask=mask)

    @triton.jit
    def _probs_tile_f16(x, shift, cap, a, b, HAS_CAP: tl.constexpr, AFFINE: tl.constexpr):
        """2^(z log2 e + shift) * dz/dy in f16 for a tile of logits x (y their affine map, z the capped y),
        its tanh and exp2 as packed f16x2 instructions; `shift` per row."""
        if HAS_CAP:
            if AFFINE:
                y = ((x.to(tl.float32) * a + b) * (1.0 / cap)).to(tl.float16)
            else:
                y = (x.to(tl.float32) * (1.0 / cap)).to(tl.float16)
            t = tl.inline_asm_elementwise("tanh.approx.f16x2 $0, $1;", "=r,r", [y], dtype=tl.float16,
                                          is_pure=True, pack=2)
            arg = t.to(tl.float32) * (cap * 1.4426950408889634) + shift[:, None]
        else:
            if AFFINE:
                arg = (x.to(tl.float32) * a + b) * 1.4426950408889634 + shift[:, None]
            else:
                arg = x.to(tl.float32) * 1.4426950408889634 + shift[:, None]
        d = tl.inline_asm_elementwise("ex2.approx.f16x2 $0, $1;", "=r,r", [arg.to(tl.float16)],
                                      dtype=tl.float16, is_pure=True, pack=2)
        if HAS_CAP:
            d = d - d * (t * t)
        return d

    @triton.jit
    def _grad_tile_f16(x, lse, tgt, d_target, col0, cap, a, b, g_scale, log2_g_scale, ignore_index,
                       HAS_CAP: tl.constexpr, AFFINE: tl.constexpr, BLOCK_V: tl.constexpr):
        """g_scale * dloss/dx of one tile in f16 (_probs_tile_f16). The scale is folded into the exponent:
        g_scale * p = 2^(z log2 e - lse log2 e + log2 g_scale) <= g_scale
        fits f16 (g_scale <= 2^15) while z from the f16 tanh stays within ~cap * 2^-10 of the forward's
        (the caller allows cap <= 40). Errors in p: the exponent's argument is rounded to f16 once
        (<= 2^-8 relative for |arg| < 16) and tanh's f16 result moves z by up to ~cap * 2^-12 (~1.5 %
        at cap 15), both below e5m2's own rounding (up to 2^-3). Not so for saturated logits
        (|x| > ~3.5 cap): there 1 - t^2 < 4e-3 carries t's ~2^-11 absolute error, as with the general
        kernel's tanh.approx.f32; those entries are rare and their gradient tiny. The target entry,
        g_scale * (p - 1), comes in as d_target, computed in fp32 (_target_grad): in f16, p - 1 for a
        confident prediction (p near 1) would lose most of its digits."""
        c = tl.arange(0, BLOCK_V)
        shift = log2_g_scale - lse * 1.4426950408889634
        d = _probs_tile_f16(x, shift, cap, a, b, HAS_CAP, AFFINE)
        d = tl.where((tgt != ignore_index)[:, None], d, 0.0).to(tl.float16)
        hit = (c[None, :] == (tgt - col0)[:, None]) & (tgt != ignore_index)[:, None]
        return tl.where(hit, d_target.to(tl.float16)[:, None], d)

    @triton.jit
    def _target_grad(X, stride_x, rows, tgt, lse, col0, cap, a, b, g_scale, ignore_index, wv, hit_w,
                     HAS_CAP: tl.constexpr, AFFINE: tl.constexpr, HAS_W: tl.constexpr, BLOCK_V: tl.constexpr):
        """g_scale * dloss_i/dx_i,t_i in fp32 for the rows whose target lies in this tile's columns
        (0 for the others: their target is another tile's, or ignored). With weights (HAS_W):
        g_scale * (wv p - hit_w) * dz/dy, wv the row's valid weights, hit_w those of its targets equal to t_i."""
        here = (tgt >= col0) & (tgt < col0 + BLOCK_V) & (tgt != ignore_index)
        xt = tl.load(X + rows.to(tl.int64) * stride_x + tgt, mask=here, other=0.0).to(tl.float32)
        z2, t = _mapped_log2(xt, cap, a, b, HAS_CAP, AFFINE, 0)
        if HAS_W:
            d = tl.exp2(z2 - lse * 1.4426950408889634) * wv - hit_w
        else:
            d = tl.exp2(z2 - lse * 1.4426950408889634) - 1.0
        if HAS_CAP:
            d = d * (1.0 - t * t)
        return tl.where(here, d * g_scale, 0.0)

    @triton.jit
    def _weighted_grad_tile_f16(X, stride_x, x, rows, T, W, LSE, col0, cap, a, b, g_scale, log2_g_scale,
                                ignore_index, HAS_CAP: tl.constexpr, AFFINE: tl.constexpr, K: tl.constexpr,
                                BLOCK_V: tl.constexpr):
        """_grad_tile_f16 for K weighted targets per row: g_scale * (wv p - sum_k w_k [j == t_k]) * dz/dy,
        wv the row's valid weights, folded into the exponent as log2(wv) (-inf, so 0, for a row without a
        valid target). Each target entry is computed in fp32 (_target_grad) with every weight of that
        column (targets may repeat). Needs g_scale * wv <= 2^15 for f16 (the FP8 head ensures it)."""
        c = tl.arange(0, BLOCK_V)
        lse = tl.load(LSE + rows)
        wv = tl.zeros(rows.shape, dtype=tl.float32)
        for k in tl.static_range(K):
            _t, w_k = _target_weights(T, W, rows, ignore_index, K, k, True)
            wv += w_k
        d = _probs_tile_f16(x, log2_g_scale + tl.log2(wv) - lse * 1.4426950408889634, cap, a, b, HAS_CAP, AFFINE)
        for k in tl.static_range(K):
            tgt_k, _w = _target_weights(T, W, rows, ignore_index, K, k, True)
            hit_w = tl.zeros(rows.shape, dtype=tl.float32)
            for j in tl.static_range(K):
                tgt_j, w_j = _target_weights(T, W, rows, ignore_index, K, j, True)
                hit_w += tl.where(tgt_j == tgt_k, w_j, 0.0)
            d_target = _target_grad(X, stride_x, rows, tgt_k, lse, col0, cap, a, b, g_scale, ignore_index, wv, hit_w,
                                    HAS_CAP, AFFINE, True, BLOCK_V)
            col_k = tl.where(tgt_k != ignore_index, tgt_k - col0, -1)  # -1: no column of the tile
            d = tl.where(c[None, :] == col_k[:, None], d_target.to(tl.float16)[:, None], d)
        return d

    @triton.jit
    def _softcap_ce_fp8_grad_fast_kernel(
        X, stride_x, T, W, LSE, G, GT16, N, V, cap, a, b, g_scale, log2_g_scale, ignore_index,
        HAS_CAP: tl.constexpr, AFFINE: tl.constexpr, K: tl.constexpr, HAS_W: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr,
    ):
        """The general kernel's contract on the GPU, for tiles that divide the shape (N even). Half the
        instructions: the math in f16 (_grad_tile_f16) and done once. The tile is worked as its even and
        odd rows; each G^T entry pair (rows 2k, 2k + 1 of one column, adjacent in G^T) is packed into one
        16-bit word by a single cvt instruction, so the transpose for G^T's store moves 16-bit values.
        (Triton 3.6 stages a layout change of 8-bit values through shared memory wrongly: G^T came out
        different from G; the general kernel avoids it by recomputing instead.) GT16 is G^T viewed as int16."""
        row0 = tl.program_id(0) * BLOCK_N
        col0 = tl.program_id(1) * BLOCK_V
        k = tl.arange(0, BLOCK_N // 2)
        c = tl.arange(0, BLOCK_V)
        x_base = X + row0.to(tl.int64) * stride_x + col0
        g_base = G + row0.to(tl.int64) * V + col0
        even = 2 * k
        x_e = tl.load(x_base + (even[:, None] * stride_x + c[None, :]))
        x_o = tl.load(x_base + ((even + 1)[:, None] * stride_x + c[None, :]))
        if HAS_W:
            d_e = _weighted_grad_tile_f16(X, stride_x, x_e, row0 + even, T, W, LSE, col0, cap, a, b, g_scale,
                                          log2_g_scale, ignore_index, HAS_CAP, AFFINE, K, BLOCK_V)
            d_o = _weighted_grad_tile_f16(X, stride_x, x_o, row0 + even + 1, T, W, LSE, col0, cap, a, b, g_scale,
                                          log2_g_scale, ignore_index, HAS_CAP, AFFINE, K, BLOCK_V)
        else:
            lse_e, lse_o = tl.load(LSE + row0 + even), tl.load(LSE + row0 + even + 1)
            tgt_e, tgt_o = tl.load(T + row0 + even).to(tl.int32), tl.load(T + row0 + even + 1).to(tl.int32)
            dt_e = _target_grad(X, stride_x, row0 + even, tgt_e, lse_e, col0, cap, a, b, g_scale, ignore_index, 1.0,
                                1.0, HAS_CAP, AFFINE, False, BLOCK_V)
            dt_o = _target_grad(X, stride_x, row0 + even + 1, tgt_o, lse_o, col0, cap, a, b, g_scale, ignore_index,
                                1.0, 1.0, HAS_CAP, AFFINE, False, BLOCK_V)
            d_e = _grad_tile_f16(x_e, lse_e, tgt_e, dt_e, col0, cap, a, b, g_scale, log2_g_scale, ignore_index,
                                 HAS_CAP, AFFINE, BLOCK_V)
            d_o = _grad_tile_f16(x_o, lse_o, tgt_o, dt_o, col0, cap, a, b, g_scale, log2_g_scale, ignore_index,
                                 HAS_CAP, AFFINE, BLOCK_V)
        tl.store(g_base + (even[:, None] * V + c[None, :]), d_e.to(G.dtype.element_ty))
        tl.store(g_base + ((even + 1)[:, None] * V + c[None, :]), d_o.to(G.dtype.element_ty))
        # low byte: row 2k (the lower address in G^T), high byte: row 2k + 1
        pair = tl.inline_asm_elementwise(
            "{ .reg .b32 t; mov.b32 t, {$1, $2}; cvt.rn.satfinite.e5m2x2.f16x2 $0, t; }",
            "=h,h,h", [d_e, d_o], dtype=tl.int16, is_pure=True, pack=1)
        half_n = N // 2
        gt_ptrs = GT16 + col0.to(tl.int64) * half_n + row0 // 2 + (c[:, None] * half_n + k[None, :])
        tl.store(gt_ptrs, tl.trans(pair))
