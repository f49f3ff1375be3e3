-- Argo CD health check for elasticllm.dev/LLMTrainingJob.
--
-- Argo CD runs this with the live object in the global `obj` and reads `status` and `message` from the
-- table it returns. Argo CD's VM (gopher-lua, Lua 5.1) opens only the base, table and package libraries
-- and a safe os: no string or math library, so numbers are rounded with % and joined with .. and
-- tostring (tests/integration/test_argocd.py runs this script in a real Argo CD). This file is the
-- single source: the argocd-cm snippets next to it are generated from it
-- (deploy/argocd/render_health_config.py) and a test keeps them in sync.
--
-- Every phase the operator writes (LLMTrainingJob status.phase) has a status:
--   Healthy      Succeeded (message: the Complete condition's); or Running with readyReplicas >= the
--                desired size and no Degraded condition
--   Progressing  no status yet, the spec not yet observed, or Pending / Scaling / Restarting
--   Degraded     Failed (message: the Failed condition's); Running below the desired size, or with
--                condition Degraded=True; any unfinished phase while WorkersRefused=True (the API server
--                refuses the workers: they never come by themselves)
--   Suspended    spec.suspend is true, or status.phase is Suspended; or Queued: Kueue holds the job until
--                it admits it (like a suspended Job that Kueue manages), message from the Admitted condition
--   Unknown      a phase this script does not know (an operator newer than this script)
--
-- The desired size is spec.replicas; when it is unset the API defaults it to spec.maxReplicas.
-- Messages of running jobs end with their training progress when status.progress has it, e.g.
-- "Running: 2/2 workers ready; step 120/1000, goodput 97%, ETA 1h3m".

local hs = {}

-- The integer part of a number (math.floor without the math library).
local function floor(value)
  return value - value % 1
end

-- A whole number as text: "120", never "120.0".
local function int(value)
  return tostring(floor(value))
end

local function count(value)
  if type(value) ~= "number" then
    return 0
  end
  return floor(value)
end

local function condition(status, kind)
  if status == nil or type(status.conditions) ~= "table" then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function reason_of(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

-- "step 120/1000, goodput 97%, ETA 1h3m" from status.progress (nil when there is none).
local function progress_of(status)
  if status == nil or type(status.progress) ~= "table" then
    return nil
  end
  local p = status.progress
  if type(p.step) ~= "number" then
    return nil
  end
  local text = "step " .. int(p.step)
  if type(p.totalSteps) == "number" and p.totalSteps > 0 then
    text = text .. "/" .. int(p.totalSteps)
  end
  if type(p.goodput) == "number" then
    text = text .. ", goodput " .. int(p.goodput * 100 + 0.5) .. "%"
  end
  if type(p.eta) == "string" and p.eta ~= "" then
    text = text .. ", ETA " .. p.eta
  end
  return text
end

local function with_progress(message, status)
  local text = progress_of(status)
  if text == nil then
    return message
  end
  return message .. "; " .. text
end

local spec = obj.spec or {}
local status = obj.status
local desired = count(spec.replicas)
if spec.replicas == nil then
  desired = count(spec.maxReplicas)
end
if desired == 0 and status ~= nil then
  -- a job whose runtime (spec.runtimeRef) supplies maxReplicas: the size the operator recorded
  desired = count(status.desiredReplicas)
end
if desired == 0 and status ~= nil then
  desired = count(status.replicas)
end

local phase = nil
if status ~= nil then
  phase = status.phase
end

if phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = with_progress(reason_of(condition(status, "Complete"), "Training finished"), status)
  return hs
end

if phase == "Failed" then
  hs.status = "Degraded"
  hs.message = reason_of(condition(status, "Failed") or condition(status, "Degraded"), "Training failed")
  return hs
end

if spec.suspend == true or phase == "Suspended" then
  hs.status = "Suspended"
  if phase == "Suspended" then
    hs.message = "Suspended: no workers run until spec.suspend is false"
  else
    hs.message = "Suspending: stopping the workers"
  end
  return hs
end

if phase == "Queued" then
  hs.status = "Suspended"
  hs.message = "Queued: " .. reason_of(condition(status, "Admitted"), "waiting for Kueue to admit the job")
  return hs
end

if phase == nil or phase == "" then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to pick up the job"
  return hs
end

local refused = condition(status, "WorkersRefused")
if refused ~= nil and refused.status == "True" then
  hs.status = "Degraded"
  hs.message = phase .. ": " .. reason_of(refused, "the API server refuses the workers")
  return hs
end

local generation = obj.metadata and obj.metadata.generation
if type(generation) == "number" and type(status.observedGeneration) == "number"
    and status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to act on the latest spec"
  return hs
end

local ready = count(status.readyReplicas)
local target = count(status.targetReplicas)
local sizes = int(ready) .. "/" .. int(desired) .. " workers ready"
if target > 0 and target ~= desired then
  sizes = sizes .. " (target " .. int(target) .. ")"
end

if phase == "Pending" or phase == "Scaling" or phase == "Restarting" then
  hs.status = "Progressing"
  local restarts = count(status.restarts)
  if phase == "Restarting" and restarts > 0 then
    hs.message = phase .. ": " .. sizes .. ", restart " .. int(restarts)
  else
    hs.message = phase .. ": " .. sizes
  end
  hs.message = with_progress(hs.message, status)
  return hs
end

if phase == "Running" then
  local degraded = condition(status, "Degraded")
  if ready < desired then
    hs.status = "Degraded"
    hs.message = "Running below the desired size: " .. sizes
    if degraded ~= nil and degraded.status == "True" and degraded.message ~= nil then
      hs.message = hs.message .. ": " .. degraded.message
    end
    hs.message = with_progress(hs.message, status)
    return hs
  end
  if degraded ~= nil and degraded.status == "True" then
    hs.status = "Degraded"
    hs.message = with_progress(reason_of(degraded, "Condition Degraded is True"), status)
    return hs
  end
  hs.status = "Healthy"
  hs.message = with_progress("Running: " .. sizes, status)
  return hs
end

hs.status = "Unknown"
hs.message = "Unrecognised phase: " .. tostring(phase)
return hs
