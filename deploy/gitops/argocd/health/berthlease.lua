-- Argo CD health of a berth.skaphos.io/BerthLease: what the Berth agent of the
-- cluster the Application deploys to says in the Ready, Reconciling and
-- Stalled conditions. A standby cluster (another holds the lease, this one's
-- agent is healthy) is Healthy, as is the holder.
local function condition(type)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == type then
      return c
    end
  end
  return nil
end

local ready = condition("Ready")
if ready == nil then
  return {status = "Progressing", message = "waiting for the Berth agent to report on this BerthLease"}
end
if (obj.status.observedGeneration or 0) < (obj.metadata.generation or 0) then
  return {status = "Progressing", message = "waiting for the Berth agent to see the latest spec"}
end
local stalled = condition("Stalled")
if stalled ~= nil and stalled.status == "True" then
  return {status = "Degraded", message = stalled.reason .. ": " .. stalled.message}
end
local reconciling = condition("Reconciling")
if reconciling ~= nil and reconciling.status == "True" then
  return {status = "Progressing", message = reconciling.reason .. ": " .. reconciling.message}
end
if ready.status == "True" then
  return {status = "Healthy", message = ready.message}
end
return {status = "Degraded", message = ready.reason .. ": " .. ready.message}
