-- The hashing scheme on the server: its only Lua copy (the Python one, and the scheme's
-- definition, are scrapy_redis_bloom/core/hashing.py; tests/test_scheme_lua.py shows the
-- two give the same bits). Prepended to the scripts that need it. An element's seeds in
-- each generation are its caller's (check_and_add.lua, from core/generations.py's
-- seed_arguments).

-- Step 4 of the scheme: the k bit offsets of an element seeded x, y, whose bits fall in a
-- span of s bits (its block when blocked, else the whole generation), counted from bit
-- ``first`` of the string. They go to out[1] .. out[k] (a table the caller made at its
-- size and reuses: no allocation per element). Inside the span, from x mod s with the
-- seeds y mod s and z = y div s (0 unblocked): offset x, then x = (x + y) mod s and
-- y = (y + i + z) mod s for i = 1 .. k - 1.
local function offsets(x, y, k, s, first, out)
  local start = x % s
  local base, z = first + x - start, math.floor(y / s)
  x, y = start, y % s
  out[1] = base + x
  for i = 1, k - 1 do
    x = (x + y) % s
    y = (y + i + z) % s
    out[i + 1] = base + x
  end
end
