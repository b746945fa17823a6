-- The agent guard (docs/agent-guard.md): one atomic call per check.
--
-- Prepended by a prelude that defines load() -> state table or nil,
-- save(state, ttl_ms), drop(), payload(ARGV[3]) -> table, limits(json) -> a table
-- the script only reads, and now() -> ms; then by enc.lua (enc(value) ->
-- JSON). Redis keeps the state as one JSON value (cjson) under KEYS[1]; the
-- memory store runs this same file in LuaJIT's interpreter, a Lua 5.1 (lupa),
-- over a table it holds.
-- Every number in the state is an integer (micro-dollars, milliseconds,
-- millionths), so a JSON round trip loses nothing and both give the same
-- answers.
--
-- Every collection the state keeps is bounded by the profile (L.max_*): a
-- session costs the same per call however long it lives, and one agent
-- inventing names cannot grow its value (docs/operations.md). Maps keyed by
-- a name the agent chooses (tools, retry tasks, kb topics) forget their least
-- recently used entry; lists keep their newest items.
--
-- ARGV: 1 op (step|result|retry|handoff|kb|usage|state|reset), 2 profile
-- limits (JSON), 3 payload (prepared by gateway/guard/service.py: hashes,
-- tokens and flags; JSON on Redis, a table in this process), 4 profile name,
-- 5 now ms ("" = server time).
-- Returns {decision, reason, evidence JSON, meta JSON, also JSON}.
-- OP 'batch': the payload is a list of {op, payload}, checked in order in
-- this one call until one is blocked; returns the five values of each
-- checked, one after the other. The state is saved once, at the end; an
-- error (an unknown op) saves nothing.

local OP, L, P, PROFILE = ARGV[1], limits(ARGV[2]), payload(ARGV[3]), ARGV[4]
local NOW = tonumber(ARGV[5]) or now()

local function round2(x) return math.floor(x * 100 + 0.5) / 100 end

local S = load()
if OP == 'reset' then
  drop()
  return {'', '', '{}', '{}', '[]'}
end
if OP == 'state' then
  if not S then return {'', '', '{}', '{}', '[]'} end
  return {'', '', enc(S), '{}', '[]'}
end
if S and S.profile ~= PROFILE then
  return {'error', 'profile_mismatch', enc({profile = S.profile}), '{}', '[]'}
end
S = S or {
  profile = PROFILE, created = NOW, steps = 0, blocked = 0, tools = {}, hist = {},
  run = {n = 0}, sub = {}, retry = {}, hand = {chain = {}, n = 0}, kb = {},
  ctx = {grow = 0, total = 0, sizes = {}}, cost = {usd = 0, tok = 0},
}
S.updated = NOW

-- The entry for `key` in `map`, touched; made from `fresh()` when missing,
-- after dropping the least recently used ones if `map` already holds `cap`.
-- The walk is over at most `cap` entries and only for a new name: a name in
-- use is never the one dropped, so a loop on it stays in view.
local function use_of(e) return e.u or 0 end  -- 0: saved before entries had one

local function entry(map, key, cap, fresh)
  local e = map[key]
  if not e then
    local keys, oldest = {}, nil
    for k, v in pairs(map) do
      keys[#keys + 1] = k
      if not oldest or use_of(v) < use_of(map[oldest]) then oldest = k end
    end
    if #keys > cap then  -- the profile's bound was lowered: down to it at once
      table.sort(keys, function(a, b) return use_of(map[a]) < use_of(map[b]) end)
      for i = 1, #keys - cap + 1 do map[keys[i]] = nil end
    elseif #keys == cap then
      map[oldest] = nil
    end
    e = fresh()
    map[key] = e
  end
  e.u = S.calls
  return e
end

-- Findings: the first block wins, else the first warning, else allow.
local found  -- of the check running (check() below)
local function finding(decision, reason, evidence)
  found[#found + 1] = {decision, reason, evidence}
end

local function budget_ratio()
  local busd, btok = S.cost.busd or L.budget_usd, S.cost.btok or L.budget_tokens
  local r = 0
  if busd > 0 then r = math.max(r, S.cost.usd / busd) end
  if btok > 0 then r = math.max(r, S.cost.tok / btok) end
  return r, busd, btok
end

local function check_budget()
  local r = budget_ratio()
  local ev = {percent = round2(r * 100)}
  if r >= 1 then finding('block', 'budget_exhausted', ev)
  elseif r >= L.budget_warn then finding('warn', 'budget_warning', ev) end
end

local function check_failures(name, t)
  if t.fail >= L.fail_block then
    finding('block', 'failure_streak', {tool = name, failures = t.fail})
  elseif t.fail >= L.fail_warn then
    finding('warn', 'failure_streak', {tool = name, failures = t.fail})
  end
end

-- Token sets are strings of 4-character hashes (gateway/guard/normalize.py:
-- tokens), each hash once; a list of words is what a session saved before.
local W = 4
local function jaccard(a, b)
  if type(a) ~= 'string' or type(b) ~= 'string' then return 0 end
  if #a == 0 or #b == 0 then return 0 end  -- nothing to compare is no evidence
  local set, inter, union = {}, 0, #a / W
  for i = 1, #a, W do set[a:sub(i, i + W - 1)] = true end
  for i = 1, #b, W do
    if set[b:sub(i, i + W - 1)] then inter = inter + 1 else union = union + 1 end
  end
  return inter / union
end

-- Two calls are the same when tool and arguments match and, where both have
-- a reported result, the results match too (a changed result is progress).
local function same_call(a, b)
  if a.s ~= b.s then return false end
  if a.r and b.r then return a.r == b.r end
  return true
end

local function new_tool() return {n = 0, fail = 0, same = 0, toks = {}} end

-- The failure streak counts a tool's failures in a row that repeat the one
-- before: the same call up to numbers (a retry counter is no new call), the
-- same failure up to numbers, and no call of any tool succeeding in between.
-- Distinct arguments, another failure or a successful step since are progress:
-- after one, the next call is no part of the streak either.
local function check_failures_of(name, t, shape)
  if t.fail > 0 and t.fash == shape and t.fprog == (S.prog or 0) then check_failures(name, t) end
end

-- Identical failures: the same call failing the same way, counted over the
-- calls the session keeps since that call last succeeded, whatever came
-- between them.
local function identical_failures(sig, rh)
  local n = 0
  for i = #S.hist, 1, -1 do
    local e = S.hist[i]
    if e.s == sig and e.r then
      if not e.f then break end  -- since the call last succeeded
      if e.r == rh then n = n + 1 end
    end
  end
  return n
end

local function check_repeated_failure(name, n)
  if n >= L.rf_block then
    finding('block', 'repeated_failure', {tool = name, failures = n})
  elseif n >= L.rf_warn then
    finding('warn', 'repeated_failure', {tool = name, failures = n})
  end
end

-- A poller's unchanged answers: too many in a row, or for too long.
local function check_poll(name, t)
  local n = t.pn or 0
  if n < 2 then return end
  local waited = NOW - (t.psince or NOW)
  if n >= L.poll_max or waited >= L.poll_ms then
    finding('block', 'poll_limit', {tool = name, unchanged = n,
      waited_seconds = math.floor(waited / 1000)})
  end
end

local function tool_state(name)
  return entry(S.tools, name, L.max_tools, new_tool)
end

local function push(list, item, cap)
  list[#list + 1] = item
  while #list > cap do table.remove(list, 1) end
end

-- enc() of {btok, busd, max_steps, steps, tok, usd}, written in enc's (sorted)
-- key order without sorting six keys on every check.
local function meta()
  local _, busd, btok = budget_ratio()
  local buf = {'{"btok":'}
  put(buf, btok)
  buf[#buf + 1] = ',"busd":'
  put(buf, busd)
  buf[#buf + 1] = ',"max_steps":'
  put(buf, L.max_steps)
  buf[#buf + 1] = ',"steps":'
  put(buf, S.steps)
  buf[#buf + 1] = ',"tok":'
  put(buf, S.cost.tok)
  buf[#buf + 1] = ',"usd":'
  put(buf, S.cost.usd)
  buf[#buf + 1] = '}'
  return table.concat(buf)
end

local function answer(commit)
  local pick
  for _, f in ipairs(found) do
    if f[1] == 'block' then pick = f break end
  end
  if not pick then
    for _, f in ipairs(found) do
      if f[1] == 'warn' then pick = f break end
    end
  end
  local blocked = pick ~= nil and pick[1] == 'block'
  if blocked then S.blocked = S.blocked + 1 elseif commit then commit() end
  local also = {}
  for _, f in ipairs(found) do
    if f ~= pick then also[#also + 1] = f[2] end
  end
  if not pick then return {'allow', 'ok', '{}', meta(), enc(also)} end
  return {pick[1], pick[2], enc(pick[3]), meta(), enc(also)}
end

-- One check: its findings, and the state changed as it commits.
local function check(OP, P)
  found = {}
  -- Orders the entries of the maps above by last use; one per check, so unique.
  S.calls = (S.calls or 0) + 1

  -- ---------------------------------------------------------------------------
  if OP == 'step' then
    local name = P.tool
    local t = S.tools[name] or new_tool()
    t.u = S.calls  -- a blocked call is a use too: the tool it loops on stays
    local call = {s = P.sig, t = name}
    check_budget()
    if not P.exempt then
      if S.steps >= L.max_steps then
        finding('block', 'step_limit', {steps = S.steps, max = L.max_steps})
      end
      if t.n >= L.max_per_tool then
        finding('block', 'tool_call_limit', {tool = name, calls = t.n, max = L.max_per_tool})
      end
      check_failures_of(name, t, P.ash)
      local last_fail = t.frh
      if last_fail then check_repeated_failure(name, identical_failures(P.sig, last_fail)) end
      if P.poll then check_poll(name, t) end
      if P.sub then
        local sa = S.sub[name] or {n = 0}
        if sa.n >= L.sub_max_calls then
          finding('block', 'subagent_call_limit',
            {tool = name, calls = sa.n, max = L.sub_max_calls})
        end
        if sa.echo then
          finding('block', 'subagent_repeated_response', {tool = name, similarity = sa.echo})
        end
      end
      -- identical: without results every repeat counts; with results, only a
      -- repeat after an unchanged result (the first result is the baseline)
      local run, streak = S.run, 1
      if P.poll then
        streak = 0  -- an unchanged poll is waiting: check_poll bounds it
      elseif run.s == P.sig then
        if not run.has or run.same then streak = run.n + 1 end
      end
      if streak >= L.ident_block then
        finding('block', 'identical_call', {tool = name, repeats = streak})
      elseif streak >= L.ident_warn then
        finding('warn', 'identical_call', {tool = name, repeats = streak})
      end
      -- cycle: the newest calls repeat with a period of cycle_min..cycle_max
      -- polls are waiting, not choices: the history checks leave them out
      local h = {}
      for i = math.max(1, #S.hist - L.history + 2), #S.hist do
        if not S.hist[i].p then h[#h + 1] = S.hist[i] end
      end
      if not P.poll then h[#h + 1] = call end
      local n, best_p, best_reps = #h, nil, 1
      for p = L.cycle_min, L.cycle_max do
        if 2 * p > n then break end
        local distinct = false
        for i = n - p + 2, n do
          if h[i].s ~= h[n - p + 1].s then distinct = true break end
        end
        if distinct then
          local m = 0
          while n - m - p >= 1 and same_call(h[n - m], h[n - m - p]) do m = m + 1 end
          local reps = 1 + math.floor(m / p)
          if reps > best_reps then best_p, best_reps = p, reps end
        end
      end
      if P.poll then best_p = nil end
      if best_p then
        local pattern = {}
        for i = n - best_p + 1, n do pattern[#pattern + 1] = h[i].t end
        local ev = {pattern = pattern, period = best_p, repetitions = best_reps}
        if best_reps >= L.cycle_block then finding('block', 'tool_cycle', ev)
        elseif best_reps >= L.cycle_warn then finding('warn', 'tool_cycle', ev) end
      end
      -- fixation: the tool's last calls since progress, all different, all alike;
      -- a call's changed result since the tool's newest call (S.fix moved on:
      -- the test run between two rewrites of a file) restarts its window
      local win = {}
      if t.fix == S.fix then
        for i = math.max(1, #t.toks - L.fix_window + 2), #t.toks do win[#win + 1] = t.toks[i] end
      end
      win[#win + 1] = {s = P.sig, k = P.toks, g = P.tgt}
      if #win >= L.fix_window and not P.poll then
        local distinct, low, targets = true, 1, true
        for i = 1, #win do
          if (win[i].g or '') == '' then targets = false end
          for j = i + 1, #win do
            if win[i].s == win[j].s then distinct = false end
            if win[i].g == win[j].g then targets = false end
            low = math.min(low, jaccard(win[i].k, win[j].k))
          end
        end
        -- every call acting on another target (a template written to many
        -- files) is not one input rephrased
        if distinct and not targets and low >= L.fix_similarity then
          finding('block', 'input_fixation', {tool = name, calls = #win, similarity = round2(low)})
        end
      end
      -- exploration: unique (tool, input[, result]) over the recent calls
      -- (distinct calls first: with their results there are no fewer, so
      -- when those are enough, no key is joined to count them)
      if n >= L.explore_min_calls and not P.poll then
        local seen, u = {}, 0
        for _, e in ipairs(h) do
          if not seen[e.s] then seen[e.s] = true u = u + 1 end
        end
        if u / n < L.explore_min_ratio then
          seen, u = {}, 0
          for _, e in ipairs(h) do
            local k = e.s .. ':' .. (e.r or '')
            if not seen[k] then seen[k] = true u = u + 1 end
          end
        end
        if u / n < L.explore_min_ratio then
          finding('block', 'low_exploration', {unique = u, calls = n, ratio = round2(u / n)})
        end
      end
      -- a narrow run: the newest calls use only a few distinct ones, though
      -- their results change (a repeat with the same result is caught above)
      if n >= L.narrow_calls and not P.poll then
        local seen, k, tools = {}, 0, {}
        for i = n - L.narrow_calls + 1, n do
          local e = h[i]
          if not seen[e.s] then
            seen[e.s] = true
            k = k + 1
            tools[#tools + 1] = e.t
          end
        end
        if k <= L.narrow_distinct then
          finding('warn', 'narrow_run', {calls = L.narrow_calls, distinct = k, tools = tools})
        end
      end
    end
    -- context: growth streak and total tokens
    local size, grow, total = P.itok, S.ctx.grow, S.ctx.total
    if size then
      local last = S.ctx.sizes[#S.ctx.sizes]
      if last and last > 0 and size * 100 >= L.drift_growth * last then
        grow = grow + 1
      else
        grow = 0
      end
      total = total + size
      if L.max_total_tokens > 0 and total > L.max_total_tokens then
        finding('block', 'token_cap', {total_tokens = total, max = L.max_total_tokens})
      elseif grow >= L.drift_steps then
        local sizes = {}
        for i = math.max(1, #S.ctx.sizes - L.drift_steps + 1), #S.ctx.sizes do
          sizes[#sizes + 1] = S.ctx.sizes[i]
        end
        sizes[#sizes + 1] = size
        finding('warn', 'context_growth', {sizes = sizes, growth_steps = grow})
      end
    end
    return answer(function()
      if size then
        push(S.ctx.sizes, size, 8)
        S.ctx.grow, S.ctx.total = grow, total
      end
      if P.exempt then return end
      S.steps = S.steps + 1
      t = tool_state(name)
      t.n = t.n + 1
      -- the check compares a new call with the window's other fix_window - 1
      if not P.poll then
        if t.fix ~= S.fix then t.toks, t.fix = {}, S.fix end
        push(t.toks, {s = P.sig, k = P.toks, g = P.tgt}, L.fix_window - 1)
      end
      t.lash = P.ash  -- the call a failure reported next belongs to
      if P.poll then call.p = 1 end
      push(S.hist, call, L.history)
      if P.sub then
        local sa = S.sub[name] or {n = 0}
        sa.n = sa.n + 1
        S.sub[name] = sa
      end
      if P.poll then return end  -- a poll neither starts nor ends an identical run
      local run = S.run
      if run.s == P.sig and (not run.has or run.same) then
        run.n = run.n + 1
      elseif run.s == P.sig then
        run.n = 1
      else
        S.run = {s = P.sig, n = 1}
        run = S.run
      end
      run.has, run.same = false, false
    end)
  end

  -- ---------------------------------------------------------------------------
  if OP == 'result' then
    local name = P.tool
    if P.exempt then
      check_budget()
      return answer(nil)
    end
    local t = tool_state(name)
    -- the result belongs to the newest call of this tool still without one;
    -- named by its arguments (P.sig), to the newest such call made with them,
    -- so calls of one tool running side by side each get their own
    local call
    for i = #S.hist, 1, -1 do
      local e = S.hist[i]
      if P.sig then
        if e.t == name and e.s == P.sig and not e.r then call = e break end
      else
        if e.t == name and not e.r then call = e break end
        if e.t == name then break end
      end
    end
    if call then
      call.r = P.rh
      if not P.ok then call.f = 1 end
      local newest = S.hist[#S.hist]
      if newest == call and S.run.s == call.s then
        S.run.same = S.run.r ~= nil and S.run.r == P.rh
        S.run.r, S.run.has = P.rh, true
      end
    end
    local changed = t.res ~= P.rh
    -- a changed result is progress: the fixation window restarts at this call;
    -- one that answers a call restarts every other tool's at its next call too
    if t.res ~= nil and changed then
      if #t.toks > 0 then t.toks = {t.toks[#t.toks]} end
      if call and not P.poll then
        local kept = t.fix == S.fix
        S.fix = (S.fix or 0) + 1
        if kept then t.fix = S.fix end
      end
    end
    -- no progress: the same result again, with nothing new from any tool
    -- since; a result that only acknowledges the call (`ok`) is no such sign
    if P.ack then t.same = 0
    elseif not changed and t.epoch == S.epoch then t.same = t.same + 1 else t.same = 1 end
    if changed then S.epoch = (S.epoch or 0) + 1 end
    t.res, t.epoch = P.rh, S.epoch
    local prog = S.prog or 0
    if P.ok then
      t.fail = 0
      -- a call that succeeded is progress for every failing tool
      if call and not P.poll then S.prog = prog + 1 end
    else
      -- the failing call's shape: its own when the result names it (calls
      -- side by side), else the tool's newest call's
      local shape = P.ash or t.lash
      local again = t.fail > 0 and t.fash == shape and t.frsh == P.rsh and t.fprog == prog
      if again then t.fail = t.fail + 1 else t.fail = 1 end
      t.fash, t.frsh, t.fprog, t.frh = shape, P.rsh, prog, P.rh
    end
    check_failures(name, t)
    if call and not P.ok then check_repeated_failure(name, identical_failures(call.s, P.rh)) end
    if P.sub then
      local sa = S.sub[name] or {n = 0}
      if sa.toks then
        local sim = jaccard(sa.toks, P.rtoks)
        if sim >= L.sub_similarity then sa.echo = round2(sim) end
      end
      sa.toks = P.rtoks
      S.sub[name] = sa
      if sa.echo then
        finding('block', 'subagent_repeated_response', {tool = name, similarity = sa.echo})
      end
    end
    if P.poll then
      if changed or not t.pn then t.pn, t.psince = 1, NOW else t.pn = t.pn + 1 end
      check_poll(name, t)
    elseif t.same >= L.same_result_warn then
      finding('warn', 'no_progress', {tool = name, same_results = t.same})
    end
    check_budget()
    return answer(nil)
  end

  -- ---------------------------------------------------------------------------
  if OP == 'retry' then
    local task = P.task
    local r = entry(S.retry, task, L.max_tasks, function() return {ts = {}} end)
    local kept = {}
    for _, ts in ipairs(r.ts or r) do  -- `or r`: a session saved when this was the list
      if ts > NOW - L.retry_window_ms then kept[#kept + 1] = ts end
    end
    S.retry[task] = {ts = kept, u = r.u}
    if P.precheck_failed then
      finding('block', 'input_missing_prerequisite_signal', {task = task})
    elseif #kept >= L.retry_max then
      finding('block', 'retry_limit', {task = task, retries = #kept, max = L.retry_max,
        window_seconds = L.retry_window_ms / 1000})
    end
    check_budget()
    return answer(function() kept[#kept + 1] = NOW end)
  end

  -- ---------------------------------------------------------------------------
  if OP == 'handoff' then
    local hand = S.hand
    local chain = {}
    for i, a in ipairs(hand.chain) do chain[i] = a end
    if #chain == 0 then chain[1] = P.source end
    chain[#chain + 1] = P.target
    local visits = {}
    for _, a in ipairs(chain) do visits[a] = (visits[a] or 0) + 1 end
    if hand.n >= L.handoff_max then
      finding('block', 'handoff_limit', {handoffs = hand.n, max = L.handoff_max, chain = chain})
    end
    if visits[P.target] > L.handoff_visits then
      finding('block', 'handoff_revisit', {target = P.target, visits = visits[P.target],
        max = L.handoff_visits, chain = chain})
    end
    check_budget()
    return answer(function()
      hand.n = hand.n + 1
      hand.chain = chain
      while #hand.chain > L.max_chain do table.remove(hand.chain, 1) end
    end)
  end

  -- ---------------------------------------------------------------------------
  if OP == 'kb' then
    local k = entry(S.kb, P.topic, L.max_topics, function() return {ts = {}, best = -1} end)
    local kept = {}
    for _, ts in ipairs(k.ts) do
      if ts > NOW - L.kb_window_ms then kept[#kept + 1] = ts end
    end
    k.ts = kept
    if P.conf and P.conf > k.best then k.best = P.conf end
    if #kept >= L.kb_max then
      finding('block', 'kb_requery', {queries = #kept, max = L.kb_max,
        window_seconds = L.kb_window_ms / 1000, best_confidence = k.best})
    end
    check_budget()
    return answer(function() kept[#kept + 1] = NOW end)
  end

  -- ---------------------------------------------------------------------------
  if OP == 'usage' then
    S.cost.usd = S.cost.usd + P.usd
    S.cost.tok = S.cost.tok + P.tok
    if P.busd then S.cost.busd = P.busd end
    if P.btok then S.cost.btok = P.btok end
    check_budget()
    return answer(nil)
  end

  return {'error', 'unknown_op', enc({op = OP}), '{}', '[]'}
end

local out
if OP == 'batch' then
  out = {}
  for _, item in ipairs(P) do
    local one = check(item[1], item[2])
    if one[1] == 'error' then return one end
    for _, v in ipairs(one) do out[#out + 1] = v end
    if one[1] == 'block' then break end
  end
else
  out = check(OP, P)
  if out[1] == 'error' then return out end
end
save(S, L.ttl_ms)
return out
