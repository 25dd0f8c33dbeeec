-- Argo CD health of an apps/Deployment. A Deployment under a BerthLease that
-- waits in a standby cluster (annotation berth.skaphos.io/lease-state:
-- standby, written by the Berth agent) is Healthy: its Pods wait behind the
-- lease gate by design. It is Degraded if its Pods cannot even be created,
-- which would stop a takeover. Every other Deployment, the holder's included,
-- is judged by the rules of Argo CD's built-in Deployment check (a health
-- customization replaces that check, so its rules are restated here).
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

local annotations = obj.metadata.annotations or {}
if annotations["berth.skaphos.io/lease-state"] == "standby" then
  local failure = condition("ReplicaFailure")
  if failure ~= nil and failure.status == "True" then
    return {status = "Degraded", message = "standby, but its Pods cannot be created: " .. (failure.message or failure.reason)}
  end
  local message = "standby: the workload runs in another cluster"
  if annotations["berth.skaphos.io/holder"] ~= nil then
    message = "standby: held by " .. annotations["berth.skaphos.io/holder"] .. " with fencing token " .. (annotations["berth.skaphos.io/fencing-token"] or "?")
  end
  return {status = "Healthy", message = message .. "; its Pods wait behind the lease gate here"}
end

if obj.spec.paused then
  return {status = "Suspended", message = "Deployment is paused"}
end
local status = obj.status or {}
if (status.observedGeneration or 0) < (obj.metadata.generation or 0) then
  return {status = "Progressing", message = "the Deployment controller has not seen the latest spec yet"}
end
local progressing = condition("Progressing")
if progressing ~= nil and progressing.reason == "ProgressDeadlineExceeded" then
  return {status = "Degraded", message = "the rollout of " .. obj.metadata.name .. " passed its progress deadline"}
end
local updated = status.updatedReplicas or 0
if obj.spec.replicas ~= nil and updated < obj.spec.replicas then
  return {status = "Progressing", message = "rolling out: " .. updated .. " of " .. obj.spec.replicas .. " replicas updated"}
end
if (status.replicas or 0) > updated then
  return {status = "Progressing", message = "rolling out: " .. ((status.replicas or 0) - updated) .. " old replica(s) still terminating"}
end
if (status.availableReplicas or 0) < updated then
  return {status = "Progressing", message = "rolling out: " .. (status.availableReplicas or 0) .. " of " .. updated .. " updated replicas available"}
end
return {status = "Healthy", message = updated .. " replica(s) updated and available"}
