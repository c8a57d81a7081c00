#pragma once
// Context shift: when a generation fills the context, keep the first n_keep positions, drop the n_discard after
// them, and move the rest down. Their keys were rotated by RoPE for their old positions; RoPE is a rotation, so one
// more rotation by -n_discard gives the key the model would have written at the new position (up to the cache
// type's rounding). Values carry no position and move as they are. The kept tokens are never recomputed; their K/V
// still hold what they attended to among the dropped tokens, so a shifted cache approximates a fresh prefill of the
// kept tokens rather than equalling it.
#include "engine/backend.h"
#include "engine/rope.h"

namespace kvgen {

// Drops positions [n_keep, n_keep + n_discard) of the backend's cache (n_keep + n_discard <= n_past): rows after
// them move down by n_discard with their keys turned back by n_discard positions; n_past becomes n_past - n_discard.
// Works through Backend::kv_read / kv_write, so on every backend, with the rows' arithmetic on the host.
void shift_kv_cache(Backend& backend, const Config& c, const RopeFreqs& rope, int n_keep, int n_discard);

// The rotation of positions' pairs by delta positions, applied to n rows of one head (head_dim floats each, pairs
// (2j, 2j + 1) for j < rope_dim / 2, as the CPU's rope()).
void rope_rotate_rows(float* x, int n, int delta, const Config& c, const RopeFreqs& rope);

}  // namespace kvgen
