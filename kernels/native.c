/* rsplan's CPU decode kernels: one token of a recurrent-state update, each state row read once and written
 * once (the row is updated in registers / L1 and stored in the same pass), as ggml's CPU ops do.
 *
 * Built at first use by rsplan.kernels._native (cc -O3 -march=native -shared) and called through ctypes; the
 * Python wrappers (kernels/<op>/native.py) check every shape, row and dtype before calling, so nothing here
 * validates again. Work items (sequence x head, or sequence x block of channels) are split into contiguous
 * ranges over `nthreads` threads (rs_parallel); different sequences write disjoint rows (the wrappers only call with
 * plans where no sequence reads a row another one writes), so the ranges never race.
 *
 * Layouts (all fp32, contiguous, N = sequences of the call, n = active ones; rows index the pool's first axis):
 *   gated delta: pool [R, Hv, Dv, Dk]; q, k [N, Hk, Dk]; v [N, Hv, Dv]; e = exp(g) [N, Hv] or [N, Hv, Dk];
 *                beta [N, Hv]; o [N, Hv, Dv]
 *   ssm scan:    pool [R, H, P, S]; xd = x * softplus(dt) [N, H, P]; dA = exp(softplus(dt) * A) [N, H] or
 *                [N, H, S]; B, C [N, G, S]; y [N, H, P]
 *   rwkv7:       pool [R, H, S, S] (value rows); r, w, k, v, a, b [N, H, S]; y [N, H, S]
 *   conv state:  pool [R, D, W - 1]; x [N, D]; wt = weight [D, W]; y [N, D]; LFM2's short conv: the same
 *                with its gates b, cg [N, D] (or NULL)
 *   rwkv6:       pool [R, H, S, S] (key rows); r, k, v, w [N, H, S]; u [H, S]; y [N, H, S]
 *   gla:         pool [R, H, S, S] (key rows); q, k, v, g [N, H, S]; y [N, H, S]
 *   lightning:   pool [R, H, S, S] (value rows); q, k, v [N, H, S]; decay = exp(-slope) [H]; y [N, H, S]
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define RS_HAVE_CSR 1
#endif

#define RS_MAX_THREADS 256

typedef void (*rs_range_fn)(const void *args, int64_t i0, int64_t i1);

typedef struct {
    rs_range_fn fn;
    const void *args;
    int64_t i0, i1;
    unsigned csr;
} rs_job;

/* fn over items [0, n) in nthreads contiguous ranges; every thread gets the caller's denormal mode
 * (torch.set_flush_denormal) for the call and its own back after.
 *
 * Built with OpenMP (rsplan.kernels._native tries -fopenmp first), the ranges run on the process's OpenMP team,
 * which is torch's: libgomp.so.1 is already loaded when this library is, so the loader binds to it. Its workers
 * wait spinning after each parallel region (of torch's or of this file's), so a one-layer call starts its second
 * thread in about a microsecond instead of the tens a pthread_create costs, and does not compete with a worker
 * that still spins after torch's last op. Without OpenMP, POSIX threads are started per call; the calling thread
 * runs the last range (and any range whose thread could not be started). */
static void rs_range_in_mode(rs_range_fn fn, const void *args, int64_t i0, int64_t i1, unsigned csr) {
#ifdef RS_HAVE_CSR
    unsigned own = _mm_getcsr();
    _mm_setcsr(csr);
#else
    (void)csr;
#endif
    fn(args, i0, i1);
#ifdef RS_HAVE_CSR
    _mm_setcsr(own);
#endif
}

#ifdef _OPENMP
#include <omp.h>
static void rs_parallel(rs_range_fn fn, const void *args, int64_t n, int nthreads) {
    unsigned csr = 0;
    if (nthreads > n) nthreads = (int)n;
    if (nthreads <= 1) {
        fn(args, 0, n);
        return;
    }
#ifdef RS_HAVE_CSR
    csr = _mm_getcsr();
#endif
#pragma omp parallel num_threads(nthreads)
    {
        int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
        rs_range_in_mode(fn, args, n * t / nt, n * (t + 1) / nt, csr);
    }
}

int rs_openmp(void) { return 1; }
#else
static void *rs_run_job(void *p) {
    const rs_job *j = (const rs_job *)p;
    rs_range_in_mode(j->fn, j->args, j->i0, j->i1, j->csr);
    return NULL;
}

static void rs_parallel(rs_range_fn fn, const void *args, int64_t n, int nthreads) {
    pthread_t th[RS_MAX_THREADS];
    rs_job jobs[RS_MAX_THREADS];
    int started[RS_MAX_THREADS];
    unsigned csr = 0;
    if (nthreads > n) nthreads = (int)n;
    if (nthreads < 1) nthreads = 1;
    if (nthreads > RS_MAX_THREADS) nthreads = RS_MAX_THREADS;
#ifdef RS_HAVE_CSR
    csr = _mm_getcsr();
#endif
    for (int t = 0; t < nthreads; t++) {
        rs_job j = {fn, args, n * t / nthreads, n * (t + 1) / nthreads, csr};
        jobs[t] = j;
    }
    for (int t = 0; t < nthreads - 1; t++) started[t] = pthread_create(&th[t], NULL, rs_run_job, &jobs[t]) == 0;
    fn(args, jobs[nthreads - 1].i0, jobs[nthreads - 1].i1);
    for (int t = 0; t < nthreads - 1; t++) {
        if (started[t])
            pthread_join(th[t], NULL);
        else
            fn(args, jobs[t].i0, jobs[t].i1);
    }
}

int rs_openmp(void) { return 0; }
#endif

/* ---------------------------------------------------------------- gated delta rule (GDN and KDA), one token */

typedef struct {
    float *pool;
    const int64_t *src, *dst, *seq; /* per active sequence: row read, row written, index along N */
    int64_t Hk, Hv, Dk, Dv;
    int kda;
    const float *q, *k, *v, *e, *beta;
    float *o;
    float scale;
} rs_gdn_args;

/* Per value row j of head h: ks = S[j] . (e * k); delta = (v[j] - ks) * beta;
 * S'[j] = e * S[j] + delta * k (stored at once); o[j] = (S'[j] . q) * scale. */
static void rs_gdn_range(const void *p, int64_t i0, int64_t i1) {
    const rs_gdn_args *a = (const rs_gdn_args *)p;
    const int64_t Dk = a->Dk, Dv = a->Dv, Hv = a->Hv, Hk = a->Hk;
    float dec[Dk], ek[Dk];
    for (int64_t it = i0; it < i1; it++) {
        const int64_t i = it / Hv, h = it % Hv, n = a->seq[i], nh = n * Hv + h;
        const float *s0 = a->pool + (a->src[i] * Hv + h) * Dv * Dk;
        float *s1 = a->pool + (a->dst[i] * Hv + h) * Dv * Dk;
        const float *k = a->k + (n * Hk + h % Hk) * Dk, *q = a->q + (n * Hk + h % Hk) * Dk;
        const float *v = a->v + nh * Dv;
        const float b = a->beta[nh];
        float *o = a->o + nh * Dv;
        for (int64_t c = 0; c < Dk; c++) {
            dec[c] = a->kda ? a->e[nh * Dk + c] : a->e[nh];
            ek[c] = dec[c] * k[c];
        }
        for (int64_t j = 0; j < Dv; j++) {
            const float *r0 = s0 + j * Dk;
            float *r1 = s1 + j * Dk;
            float ks = 0.0f, acc = 0.0f;
            for (int64_t c = 0; c < Dk; c++) ks += r0[c] * ek[c];
            const float delta = (v[j] - ks) * b;
            for (int64_t c = 0; c < Dk; c++) {
                const float s = r0[c] * dec[c] + delta * k[c];
                r1[c] = s;
                acc += s * q[c];
            }
            o[j] = acc * a->scale;
        }
    }
}

void rs_gated_delta_decode(float *pool, const int64_t *src, const int64_t *dst, const int64_t *seq, int64_t n_act,
                           int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, int kda, const float *q, const float *k,
                           const float *v, const float *e, const float *beta, float *o, float scale, int nthreads) {
    rs_gdn_args a = {pool, src, dst, seq, Hk, Hv, Dk, Dv, kda, q, k, v, e, beta, o, scale};
    rs_parallel(rs_gdn_range, &a, n_act * Hv, nthreads);
}

/* ---------------------------------------------------------------- selective scan (Mamba-2 and Mamba-1), one token */

typedef struct {
    float *pool;
    const int64_t *src, *dst, *seq;
    int64_t H, P, G, S;
    int mamba1;
    const float *xd, *dA, *B, *C;
    float *y;
} rs_ssm_args;

/* Per row p of head h (group g = h / (H / G)): S'[p] = dA * S[p] + xd[p] * B[g] (stored at once);
 * y[p] = S'[p] . C[g]. */
static void rs_ssm_range(const void *p, int64_t i0, int64_t i1) {
    const rs_ssm_args *a = (const rs_ssm_args *)p;
    const int64_t H = a->H, P = a->P, S = a->S, hg = a->H / a->G;
    float da[S];
    for (int64_t it = i0; it < i1; it++) {
        const int64_t i = it / H, h = it % H, n = a->seq[i], nh = n * H + h, ng = n * a->G + h / hg;
        const float *s0 = a->pool + (a->src[i] * H + h) * P * S;
        float *s1 = a->pool + (a->dst[i] * H + h) * P * S;
        const float *B = a->B + ng * S, *C = a->C + ng * S, *xd = a->xd + nh * P;
        float *y = a->y + nh * P;
        for (int64_t c = 0; c < S; c++) da[c] = a->mamba1 ? a->dA[nh * S + c] : a->dA[nh];
        for (int64_t r = 0; r < P; r++) {
            const float *r0 = s0 + r * S;
            float *r1 = s1 + r * S;
            const float x = xd[r];
            float acc = 0.0f;
            for (int64_t c = 0; c < S; c++) {
                const float s = r0[c] * da[c] + x * B[c];
                r1[c] = s;
                acc += s * C[c];
            }
            y[r] = acc;
        }
    }
}

void rs_ssm_scan_decode(float *pool, const int64_t *src, const int64_t *dst, const int64_t *seq, int64_t n_act,
                        int64_t H, int64_t P, int64_t G, int64_t S, int mamba1, const float *xd, const float *dA,
                        const float *B, const float *C, float *y, int nthreads) {
    rs_ssm_args a = {pool, src, dst, seq, H, P, G, S, mamba1, xd, dA, B, C, y};
    rs_parallel(rs_ssm_range, &a, n_act * H, nthreads);
}

/* ---------------------------------------------------------------- RWKV-7 wkv, one token */

typedef struct {
    float *pool;
    const int64_t *src, *dst, *seq;
    int64_t H, S;
    const float *r, *w, *k, *v, *a, *b;
    float *y;
} rs_wkv7_args;

/* Per value row i of head h: sa = S[i] . a; S'[i] = S[i] * w + v[i] * k + sa * b (stored at once);
 * y[i] = S'[i] . r. */
static void rs_wkv7_range(const void *p, int64_t i0, int64_t i1) {
    const rs_wkv7_args *a = (const rs_wkv7_args *)p;
    const int64_t H = a->H, S = a->S;
    for (int64_t it = i0; it < i1; it++) {
        const int64_t i = it / H, h = it % H, nh = a->seq[i] * H + h;
        const float *s0 = a->pool + (a->src[i] * H + h) * S * S;
        float *s1 = a->pool + (a->dst[i] * H + h) * S * S;
        const float *r = a->r + nh * S, *w = a->w + nh * S, *k = a->k + nh * S, *v = a->v + nh * S;
        const float *av = a->a + nh * S, *b = a->b + nh * S;
        float *y = a->y + nh * S;
        for (int64_t row = 0; row < S; row++) {
            const float *r0 = s0 + row * S;
            float *r1 = s1 + row * S;
            float sa = 0.0f, acc = 0.0f;
            for (int64_t c = 0; c < S; c++) sa += r0[c] * av[c];
            const float vi = v[row];
            for (int64_t c = 0; c < S; c++) {
                const float s = r0[c] * w[c] + vi * k[c] + sa * b[c];
                r1[c] = s;
                acc += s * r[c];
            }
            y[row] = acc;
        }
    }
}

void rs_rwkv7_decode(float *pool, const int64_t *src, const int64_t *dst, const int64_t *seq, int64_t n_act,
                     int64_t H, int64_t S, const float *r, const float *w, const float *k, const float *v,
                     const float *a, const float *b, float *y, int nthreads) {
    rs_wkv7_args args = {pool, src, dst, seq, H, S, r, w, k, v, a, b, y};
    rs_parallel(rs_wkv7_range, &args, n_act * H, nthreads);
}

/* ---------------------------------------------------------------- conv state (ggml_ssm_conv + window planes), one token */

#define RS_CONV_BLOCK 512 /* channels per work item */

/* The arguments of one call, passed by address: kernels/conv_state/native.py packs them once per (pool, rows,
 * inputs) and calls again with the same block while the same tensors come back (ConvArgs there mirrors this
 * layout field for field; every field is 8 bytes). */
typedef struct {
    float *pool;
    const int64_t *src, *rows, *seq; /* rows [n_written][n_act]: the row of plane p of each active sequence */
    int64_t n_act, n_written, D, W;
    const float *x, *wt;
    const float *b, *cg; /* LFM2's gates [N, D] (NULL: none): the conv runs on b * x, y = cg * conv */
    float *y;
} rs_conv_args;

#define RS_CONV_CHUNK 64 /* channels whose old windows are staged on the stack (in L1) at a time */

/* m channels of one sequence (W the conv width, a constant where rs_conv_range instantiates it: the loops over
 * the window then unroll and the channel loop vectorises). Per channel: y = old . wt[:W-1] + x * wt[W-1]; the
 * new window, old shifted by one with x appended, into w1. With LFM2's gates (gb, gc not NULL), x is gb * x
 * (the value the window keeps) and y is gc * (the conv). `old` is a staged copy of the source windows, so no
 * pointer here aliases another (the source row and plane 0 are often the same row). */
static inline __attribute__((always_inline)) void rs_conv_chunk(const int64_t W, const float *restrict old,
                                                                float *restrict w1, const float *restrict wt,
                                                                const float *restrict xs, const float *restrict gb,
                                                                const float *restrict gc, float *restrict y,
                                                                int64_t m) {
    for (int64_t c = 0; c < m; c++) {
        const float xv = gb ? gb[c] * xs[c] : xs[c];
        float acc = xv * wt[c * W + W - 1];
        for (int64_t t = 0; t < W - 1; t++) acc += old[c * (W - 1) + t] * wt[c * W + t];
        y[c] = gc ? gc[c] * acc : acc;
        for (int64_t t = 0; t + 1 < W - 1; t++) w1[c * (W - 1) + t] = old[c * (W - 1) + t + 1];
        w1[c * (W - 1) + W - 2] = xv;
    }
}

#define RS_CONV_AHEAD 4 /* chunks read ahead: one thread alone keeps too few DRAM reads in flight without it */

/* Asks for the window and the inputs of the chunk at channel k (of sequence row n, window row win) to be brought
 * in: a hint only (past the row's end it touches the next row or nothing, and never faults). Measured on a
 * 2-vCPU EPYC guest with the caches flushed between steps: lfm2-1.2b (D 2048, W 3) 8 layers, -np 8 and 64,
 * 7.5-8.6 GB/s without, 9.8-10.6 GB/s with. */
static inline __attribute__((always_inline)) void rs_conv_prefetch(const rs_conv_args *a, const float *win,
                                                                   int64_t n, int64_t k, const int64_t W) {
    for (int64_t f = 0; f < RS_CONV_CHUNK * (W - 1); f += 16) __builtin_prefetch(win + k * (W - 1) + f, 0, 0);
    for (int64_t f = 0; f < RS_CONV_CHUNK; f += 16) {
        __builtin_prefetch(a->x + n * a->D + k + f, 0, 0);
        if (a->b) {
            __builtin_prefetch(a->b + n * a->D + k + f, 0, 0);
            __builtin_prefetch(a->cg + n * a->D + k + f, 0, 0);
        }
    }
}

/* Channels [c0, c1) of active sequence i: planes 1 .. n_written-1 get the old window, plane 0 the shifted one.
 * The planes are written first, straight from the source row; then each chunk of old windows is read once
 * into the stack before its part of plane 0 is written. A source row that is also one of the sequence's plane
 * rows therefore holds the same window again when plane 0 reads it. */
static inline __attribute__((always_inline)) void rs_conv_item(const rs_conv_args *a, int64_t i, int64_t c0,
                                                               int64_t c1, const int64_t W) {
    const int64_t D = a->D, n = a->seq[i];
    const float *win = a->pool + a->src[i] * D * (W - 1);
    float *w0 = a->pool + a->rows[i] * D * (W - 1);
    for (int64_t pl = 1; pl < a->n_written; pl++)
        memmove(a->pool + (a->rows[pl * a->n_act + i] * D + c0) * (W - 1), win + c0 * (W - 1),
                (size_t)((c1 - c0) * (W - 1)) * sizeof(float));
    for (int64_t k0 = c0; k0 < c1; k0 += RS_CONV_CHUNK) {
        const int64_t m = k0 + RS_CONV_CHUNK < c1 ? RS_CONV_CHUNK : c1 - k0;
        rs_conv_prefetch(a, win, n, k0 + RS_CONV_AHEAD * RS_CONV_CHUNK, W);
        float old[RS_CONV_CHUNK * (W - 1)];
        memcpy(old, win + k0 * (W - 1), (size_t)(m * (W - 1)) * sizeof(float));
        const float *xs = a->x + n * D + k0, *wt = a->wt + k0 * W;
        float *w1 = w0 + k0 * (W - 1), *y = a->y + n * D + k0;
        if (a->b) /* the gates come together (shortconv) or not at all (conv_state) */
            rs_conv_chunk(W, old, w1, wt, xs, a->b + n * D + k0, a->cg + n * D + k0, y, m);
        else
            rs_conv_chunk(W, old, w1, wt, xs, NULL, NULL, y, m);
    }
}

static void rs_conv_range(const void *p, int64_t i0, int64_t i1) {
    const rs_conv_args *a = (const rs_conv_args *)p;
    const int64_t D = a->D, W = a->W, nb = (D + RS_CONV_BLOCK - 1) / RS_CONV_BLOCK;
    for (int64_t it = i0; it < i1; it++) {
        const int64_t i = it / nb, c0 = (it % nb) * RS_CONV_BLOCK;
        const int64_t c1 = c0 + RS_CONV_BLOCK < D ? c0 + RS_CONV_BLOCK : D;
        switch (W) {
        case 2: rs_conv_item(a, i, c0, c1, 2); break;
        case 3: rs_conv_item(a, i, c0, c1, 3); break;
        case 4: rs_conv_item(a, i, c0, c1, 4); break;
        case 5: rs_conv_item(a, i, c0, c1, 5); break;
        default: rs_conv_item(a, i, c0, c1, W); break;
        }
    }
}

void rs_conv_state_decode(const rs_conv_args *a, int nthreads) {
    const int64_t nb = (a->D + RS_CONV_BLOCK - 1) / RS_CONV_BLOCK;
    rs_parallel(rs_conv_range, a, a->n_act * nb, nthreads);
}

/* n packed conv-state calls run in order, as rs_conv_state_decode would run them one by one (a decode step's
 * layers, caught once: rsplan.kernels.conv_state.native.Replay): call i on bytes[i] / bytes_per_thread threads,
 * at least one and at most max_threads, the rule of rsplan.kernels._native.threads. */
void rs_conv_state_replay(const rs_conv_args *const *calls, const int64_t *bytes, int64_t n,
                          int64_t bytes_per_thread, int max_threads) {
    for (int64_t i = 0; i < n; i++) {
        int64_t t = bytes[i] / bytes_per_thread;
        if (t > max_threads) t = max_threads;
        rs_conv_state_decode(calls[i], t < 1 ? 1 : (int)t);
    }
}

/* ---------------------------------------------------------------- RWKV-6 wkv and gated linear attention, one token */

typedef struct {
    float *pool;
    const int64_t *src, *dst, *seq;
    int64_t H, S;
    int gla; /* 0: wkv6 (read-out before the update, bonus u); 1: gla (read-out after the update, scaled) */
    const float *r, *k, *v, *w, *u; /* gla: r = q, w = g, u unused */
    float *y;
    float scale;
} rs_wkv6_args;

/* The state rows are keys: per key row i of head h, S'[i] = w[i] * S[i] + k[i] * v (stored at once) and the
 * read-out gathers over rows into a value vector: wkv6 y += r[i] * S[i] (the old row), then
 * y += (sum_i r[i] u[i] k[i]) * v; gla y += scale * q[i] * S'[i] (the new row). */
static void rs_wkv6_range(const void *p, int64_t i0, int64_t i1) {
    const rs_wkv6_args *a = (const rs_wkv6_args *)p;
    const int64_t H = a->H, S = a->S;
    float acc[S];
    for (int64_t it = i0; it < i1; it++) {
        const int64_t i = it / H, h = it % H, nh = a->seq[i] * H + h;
        const float *s0 = a->pool + (a->src[i] * H + h) * S * S;
        float *s1 = a->pool + (a->dst[i] * H + h) * S * S;
        const float *r = a->r + nh * S, *k = a->k + nh * S, *v = a->v + nh * S, *w = a->w + nh * S;
        float *y = a->y + nh * S;
        for (int64_t c = 0; c < S; c++) acc[c] = 0.0f;
        for (int64_t row = 0; row < S; row++) {
            const float *r0 = s0 + row * S;
            float *r1 = s1 + row * S;
            const float wi = w[row], ki = k[row];
            if (a->gla) {
                const float qi = r[row] * a->scale;
                for (int64_t c = 0; c < S; c++) {
                    const float s = r0[c] * wi + ki * v[c];
                    r1[c] = s;
                    acc[c] += qi * s;
                }
            } else {
                const float ri = r[row];
                for (int64_t c = 0; c < S; c++) {
                    const float s = r0[c];
                    acc[c] += ri * s;
                    r1[c] = s * wi + ki * v[c];
                }
            }
        }
        float bonus = 0.0f;
        if (!a->gla)
            for (int64_t c = 0; c < S; c++) bonus += r[c] * a->u[h * S + c] * k[c];
        for (int64_t c = 0; c < S; c++) y[c] = acc[c] + bonus * v[c];
    }
}

void rs_wkv6_decode(float *pool, const int64_t *src, const int64_t *dst, const int64_t *seq, int64_t n_act,
                    int64_t H, int64_t S, int gla, const float *r, const float *k, const float *v, const float *w,
                    const float *u, float *y, float scale, int nthreads) {
    rs_wkv6_args args = {pool, src, dst, seq, H, S, gla, r, k, v, w, u, y, scale};
    rs_parallel(rs_wkv6_range, &args, n_act * H, nthreads);
}

/* ---------------------------------------------------------------- lightning attention (MiniMax-01), one token */

typedef struct {
    float *pool;
    const int64_t *src, *dst, *seq;
    int64_t H, S;
    const float *q, *k, *v, *decay;
    float *y;
} rs_lightning_args;

/* The state rows are values: per value row j of head h, S'[j] = decay[h] * S[j] + v[j] * k (stored at once);
 * y[j] = S'[j] . q. */
static void rs_lightning_range(const void *p, int64_t i0, int64_t i1) {
    const rs_lightning_args *a = (const rs_lightning_args *)p;
    const int64_t H = a->H, S = a->S;
    for (int64_t it = i0; it < i1; it++) {
        const int64_t i = it / H, h = it % H, nh = a->seq[i] * H + h;
        const float *s0 = a->pool + (a->src[i] * H + h) * S * S;
        float *s1 = a->pool + (a->dst[i] * H + h) * S * S;
        const float *q = a->q + nh * S, *k = a->k + nh * S, *v = a->v + nh * S;
        const float d = a->decay[h];
        float *y = a->y + nh * S;
        for (int64_t row = 0; row < S; row++) {
            const float *r0 = s0 + row * S;
            float *r1 = s1 + row * S;
            const float vj = v[row];
            float acc = 0.0f;
            for (int64_t c = 0; c < S; c++) {
                const float s = r0[c] * d + vj * k[c];
                r1[c] = s;
                acc += s * q[c];
            }
            y[row] = acc;
        }
    }
}

void rs_lightning_decode(float *pool, const int64_t *src, const int64_t *dst, const int64_t *seq, int64_t n_act,
                         int64_t H, int64_t S, const float *q, const float *k, const float *v, const float *decay,
                         float *y, int nthreads) {
    rs_lightning_args args = {pool, src, dst, seq, H, S, q, k, v, decay, y};
    rs_parallel(rs_lightning_range, &args, n_act * H, nthreads);
}
