-- Argo CD health of an apps/StatefulSet. A StatefulSet under a BerthLease that
-- waits in a standby cluster (annotation berth.skaphos.io/lease-state:
-- standby, written by the Berth agent) is Healthy: its Pods wait behind the
-- lease gate by design. Every other StatefulSet, the holder's included, gets
-- Argo CD's own StatefulSet health, written out below because a health
-- customization replaces the built-in check.
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
  return {status = "Progressing", message = "Waiting for statefulset spec update to be observed..."}
end
local replicas = obj.spec.replicas
if replicas ~= nil and (status.readyReplicas or 0) < replicas then
  return {status = "Progressing", message = "Waiting for " .. (replicas - (status.readyReplicas or 0)) .. " pods to be ready..."}
end
local strategy = obj.spec.updateStrategy or {}
if strategy.type == "RollingUpdate" and strategy.rollingUpdate ~= nil and strategy.rollingUpdate.partition ~= nil then
  local want = (replicas or 1) - strategy.rollingUpdate.partition
  if (status.updatedReplicas or 0) < want then
    return {status = "Progressing", message = "Waiting for partitioned roll out to finish: " .. (status.updatedReplicas or 0) .. " out of " .. want .. " new pods have been updated..."}
  end
  return {status = "Healthy", message = "partitioned roll out complete: " .. (status.updatedReplicas or 0) .. " new pods have been updated..."}
end
if strategy.type == "OnDelete" then
  return {status = "Healthy", message = "statefulset has " .. (status.readyReplicas or 0) .. " ready pods"}
end
if status.updateRevision ~= status.currentRevision then
  return {status = "Progressing", message = "waiting for statefulset rolling update to complete " .. (status.updatedReplicas or 0) .. " pods at revision " .. (status.updateRevision or "") .. "..."}
end
return {status = "Healthy", message = "statefulset rolling update complete " .. (status.currentReplicas or 0) .. " pods at revision " .. (status.currentRevision or "") .. "..."}
