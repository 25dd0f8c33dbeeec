-- Argo CD health of an apps/StatefulSet. A StatefulSet under a BerthLease that
-- waits in a standby cluster (annotation berth.skaphos.io/lease-state:
-- standby, written by the Berth agent) is Healthy: its Pods wait behind the
-- lease gate by design. Every other StatefulSet, the holder's included, is
-- judged by the rules of Argo CD's built-in StatefulSet check (a health
-- customization replaces that check, so its rules are restated here).
local annotations = obj.metadata.annotations or {}
if annotations["berth.skaphos.io/lease-state"] == "standby" then
  local message = "standby: the workload runs in another cluster"
  if annotations["berth.skaphos.io/holder"] ~= nil then
    message = "standby: held by " .. annotations["berth.skaphos.io/holder"] .. " with fencing token " .. (annotations["berth.skaphos.io/fencing-token"] or "?")
  end
  return {status = "Healthy", message = message .. "; its Pods wait behind the lease gate here"}
end

local status = obj.status or {}
if (status.observedGeneration or 0) == 0 or (obj.metadata.generation or 0) > status.observedGeneration then
  return {status = "Progressing", message = "the StatefulSet controller has not seen the latest spec yet"}
end
local replicas = obj.spec.replicas
if replicas ~= nil and (status.readyReplicas or 0) < replicas then
  return {status = "Progressing", message = (replicas - (status.readyReplicas or 0)) .. " Pod(s) not ready yet"}
end
local strategy = obj.spec.updateStrategy or {}
if strategy.type == "RollingUpdate" and strategy.rollingUpdate ~= nil and strategy.rollingUpdate.partition ~= nil then
  local want = (replicas or 1) - strategy.rollingUpdate.partition
  if (status.updatedReplicas or 0) < want then
    return {status = "Progressing", message = "rolling out to the partition: " .. (status.updatedReplicas or 0) .. " of " .. want .. " Pods updated"}
  end
  return {status = "Healthy", message = "rolled out to the partition: " .. (status.updatedReplicas or 0) .. " Pod(s) updated"}
end
if strategy.type == "OnDelete" then
  return {status = "Healthy", message = (status.readyReplicas or 0) .. " Pod(s) ready (updated on delete)"}
end
if status.updateRevision ~= status.currentRevision then
  return {status = "Progressing", message = "rolling out: " .. (status.updatedReplicas or 0) .. " Pod(s) at revision " .. (status.updateRevision or "")}
end
return {status = "Healthy", message = "rolled out: " .. (status.currentReplicas or 0) .. " Pod(s) at revision " .. (status.currentRevision or "")}
