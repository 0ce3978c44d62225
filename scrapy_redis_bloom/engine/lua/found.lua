-- Included (--@ found): set ``seen`` to whether the element at ARGV[e] is in the older
-- generations (and the window before; from ``low``, past a lost generation 0 not
-- recreated); with ``w`` the newest is left to the caller, which sets its bits and answers
-- for it.
seen = false
for _, view in ipairs(views) do
  if view.G and not seen then
    local top = view.G - 1
    if write and view == cur then top = top - 1 end
    for g = top, view.low, -1 do
      if has(view.base .. g, g, e) then seen = true break end
    end
  end
end
