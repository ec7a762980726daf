/** Reproducible "random" bytes (xorshift32 from `seed`), so a failure can be replayed byte for byte. */
export const pseudoRandomBytes = (length: number, seed: number): Uint8Array => {
  const out = new Uint8Array(length)
  let x = seed
  for (let i = 0; i < length; i++) {
    x ^= x << 13
    x ^= x >>> 17
    x ^= x << 5
    out[i] = x & 0xff
  }
  return out
}

/** Noise that is not a valid container of any kind (the same bytes for the same length). */
export const noise = (length: number): Uint8Array => pseudoRandomBytes(length, 2463534242)
