package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BerthLeaseSpec names the lease a workload runs under and its timing.
//
// +kubebuilder:validation:XValidation:rule="!has(self.heartbeatIntervalSeconds) || !has(self.ttlSeconds) || self.heartbeatIntervalSeconds * 3 <= self.ttlSeconds",message="heartbeatIntervalSeconds must be at most a third of ttlSeconds, so that a renewal can fail and be retried, and Pods be stopped, before the lease runs out"
type BerthLeaseSpec struct {
	// LeaseName is the lease's name at the lease API; the key is
	// {namespace of this BerthLease}/{leaseName}. Defaults to this object's name.
	// It cannot be changed. Within a namespace, only the oldest BerthLease
	// naming a lease acts on it; the others wait (condition reason
	// LeaseNameInUse) until it is gone.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	LeaseName string `json:"leaseName,omitempty"`

	// HolderIdentity is the holder used when the agent runs without
	// --cluster-id. With --cluster-id, the cluster id is the holder and this
	// field is ignored.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	HolderIdentity string `json:"holderIdentity,omitempty"`

	// TTLSeconds is the lease's term: how long after a renewal another
	// cluster may take over if this one stops renewing.
	// +optional
	// +kubebuilder:default=30
	// +kubebuilder:validation:Minimum=3
	// +kubebuilder:validation:Maximum=86400
	TTLSeconds int32 `json:"ttlSeconds,omitempty"`

	// HeartbeatIntervalSeconds is how often the holder renews.
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=1
	HeartbeatIntervalSeconds int32 `json:"heartbeatIntervalSeconds,omitempty"`

	// PodFencing puts the lease's local deadline inside every managed Pod as
	// well as in the agent. None (the default) leaves it to the agent: a
	// holder's Pods stop when its agent stops them. Exec has admission wrap
	// each container's command in berth-fence, which starts the workload
	// only once the lease API confirms this cluster holds the lease with the
	// Pod's fencing token, and stops it before the term could pass to
	// another cluster, whether or not the agent or the cluster's control
	// plane are alive (docs/fencing.md). Each container must then name its
	// command in the Pod template, and each Pod needs the lease API to
	// start. It applies to Pods created after it is set.
	// +optional
	// +kubebuilder:validation:Enum=None;Exec
	PodFencing PodFencing `json:"podFencing,omitempty"`

	// Placement says where the lease should run: the clusters in order of
	// preference, and whether it moves back to a more preferred cluster once
	// that cluster is healthy again. Only an agent with a --cluster-id acts
	// on it.
	// +optional
	Placement *Placement `json:"placement,omitempty"`

	// Failover hands the lease over when this cluster's Pods do not become
	// Ready after they are ungated: the workload cannot run here (no
	// capacity, an image that cannot be pulled, a crash loop whose restart
	// back-off outlasts unreadySeconds), so another cluster should try. It needs the
	// agent's --managed-workloads and a --cluster-id.
	// +optional
	Failover *Failover `json:"failover,omitempty"`
}

// Placement is a BerthLease's preference of clusters.
// +kubebuilder:validation:XValidation:rule="!has(self.failback) || (has(self.preferred) && size(self.preferred) > 0)",message="failback needs at least one preferred cluster to move back to"
type Placement struct {
	// Preferred names the clusters the lease should run on, most preferred
	// first: each entry a cluster id, or a selector of the labels clusters
	// register (the agent's --cluster-labels). A cluster that no entry
	// names comes after every one that is named. Without Failback, the
	// preference only decides where a failback goes: the first cluster to
	// ask still takes a free lease.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	Preferred []ClusterPreference `json:"preferred,omitempty"`

	// Failback moves the lease from its holder to a more preferred cluster
	// once that cluster has been healthy (registered, heartbeating, not
	// cordoned) for the whole stabilization window. The move is a
	// handover: the holder stops its Pods, gives the term up, and the lease
	// API reserves the lease for that cluster.
	// +optional
	Failback *Failback `json:"failback,omitempty"`
}

// ClusterPreference names clusters by id or by their labels.
// +kubebuilder:validation:XValidation:rule="has(self.cluster) != has(self.selector)",message="set exactly one of cluster and selector"
// +kubebuilder:validation:XValidation:rule="!has(self.selector) || (has(self.selector.matchLabels) && size(self.selector.matchLabels) > 0) || (has(self.selector.matchExpressions) && size(self.selector.matchExpressions) > 0)",message="an empty selector names no cluster: give matchLabels or matchExpressions"
type ClusterPreference struct {
	// Cluster is a cluster id (an agent's --cluster-id): a lowercase RFC
	// 1123 subdomain.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Cluster string `json:"cluster,omitempty"`
	// Selector matches the labels a cluster's agent registers. It must name
	// labels (an empty selector names no cluster here, not every one). One
	// that does not parse (an unknown operator, a bad key) names no cluster
	// either: the holder's agent then makes no failback and says so (Warning
	// InvalidPlacement).
	// +optional
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
}

// Failback is when a lease moves back to a more preferred cluster.
type Failback struct {
	// StabilizationSeconds is how long a more preferred cluster must have
	// been healthy without a break before the lease moves to it, as the
	// holder's agent saw it: a cluster that keeps failing and coming back
	// never gets the lease. The holder's agent starts counting anew when it
	// restarts.
	// +optional
	// +kubebuilder:default=300
	// +kubebuilder:validation:Minimum=5
	// +kubebuilder:validation:Maximum=86400
	StabilizationSeconds int32 `json:"stabilizationSeconds,omitempty"`
}

// Failover is when a holder whose Pods cannot run hands the lease over.
type Failover struct {
	// UnreadySeconds is how long a managed Pod may stay not Ready while this
	// cluster holds the lease (counted from the latest of the term's start
	// as the holder's agent saw it, the Pod's creation, and the last change
	// of its Ready condition) before the lease is moved to any other
	// cluster. It backs off: each move in a row that brought the lease to
	// this cluster (see WindowSeconds) doubles it, up to a quarter of the
	// window.
	// +kubebuilder:validation:Minimum=5
	// +kubebuilder:validation:Maximum=86400
	UnreadySeconds int32 `json:"unreadySeconds"`
	// MaxMoves bounds the moves of the lease in a row, as the lease API's
	// term history counts them (failbacks, failovers and administrators'
	// moves, in any cluster): after them a workload that fails everywhere
	// stops circling the fleet and stays where it is, with a Warning Event,
	// until its Pods have been Ready for the window; no failback is made
	// meanwhile.
	// +optional
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	MaxMoves int32 `json:"maxMoves,omitempty"`
	// WindowSeconds is the window of MaxMoves: moves count in a row when
	// each ended less than the window before the next (the window is four
	// times UnreadySeconds when that is longer). Keep it well above the
	// Pods' stop time.
	// +optional
	// +kubebuilder:default=3600
	// +kubebuilder:validation:Minimum=60
	// +kubebuilder:validation:Maximum=604800
	WindowSeconds int32 `json:"windowSeconds,omitempty"`
}

// PodFencing says whether a BerthLease's managed Pods fence themselves.
type PodFencing string

// Values of BerthLeaseSpec.PodFencing.
const (
	// PodFencingNone: the agent alone stops the Pods.
	PodFencingNone PodFencing = "None"
	// PodFencingExec: each container runs under berth-fence.
	PodFencingExec PodFencing = "Exec"
)

// BerthLeaseStatus is what this cluster's agent knows of the lease.
type BerthLeaseStatus struct {
	// LeaseState is held, waiting or released.
	// +optional
	// +kubebuilder:validation:Enum=held;waiting;released
	LeaseState string `json:"leaseState,omitempty"`

	// Phase is Active while this cluster may run the managed Pods, Stopping
	// while it removes them before giving the lease up, and empty otherwise.
	// +optional
	// +kubebuilder:validation:Enum=Active;Stopping;""
	Phase string `json:"phase,omitempty"`

	// CurrentHolder is the holder the lease API last reported.
	// +optional
	CurrentHolder string `json:"currentHolder,omitempty"`

	// FencingToken is the token of the current holder's term.
	// +optional
	FencingToken int32 `json:"fencingToken,omitempty"`

	// ReleasingToken is a fencing token of this cluster whose release was
	// sent and not confirmed: it may still land at the lease API at any time
	// and free the term. The agent records it before it sends a release, so
	// that an agent that starts anew (a restart, a fleet member replaced)
	// never runs Pods under that term again: it only stops them and releases
	// it. Cleared once a release is confirmed.
	// +optional
	ReleasingToken int32 `json:"releasingToken,omitempty"`

	// FencedToken is the fencing token of the latest term of this cluster
	// under which Pods ran under berth-fence (spec.podFencing Exec). The agent
	// records it before it ungates such Pods, and gives that term up by
	// revoking it, never by releasing it, even after a restart or once
	// spec.podFencing no longer asks for it: a fenced Pod forced off an
	// unreachable node may still run there until its own deadline, which
	// only the term's expiry is sure to follow (docs/fencing.md).
	// +optional
	FencedToken int32 `json:"fencedToken,omitempty"`

	// AcquiredAt is when the current term began (the lease API's time).
	// +optional
	AcquiredAt *metav1.MicroTime `json:"acquiredAt,omitempty"`
	// RenewTime and ExpiresAt are no longer written: status changes on
	// transitions only, not at every renewal, so that a cluster of
	// thousands of BerthLeases does not write status thousands of times a
	// heartbeat. The agent's metric berth_agent_lease_renew_timestamp_seconds
	// and the lease API (berthctl leases list) have the renewals; the
	// HeartbeatHealthy condition says whether they succeed. The agent clears
	// values an earlier release wrote.
	// +optional
	RenewTime *metav1.MicroTime `json:"renewTime,omitempty"`
	// +optional
	ExpiresAt *metav1.MicroTime `json:"expiresAt,omitempty"`

	// ObservedGeneration is the generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// ManagedPods counts this lease's managed Pods in this cluster;
	// RunningPods those of them that are ungated; GatedPods those waiting.
	// +optional
	ManagedPods int32 `json:"managedPods,omitempty"`
	// +optional
	RunningPods int32 `json:"runningPods,omitempty"`
	// +optional
	GatedPods int32 `json:"gatedPods,omitempty"`

	// Conditions are Acquired and HeartbeatHealthy, and their summary as
	// kstatus (Flux, kubectl wait) and Argo CD read health: Ready, always
	// (True while this cluster runs the workload or stands by with a healthy
	// agent), and Reconciling and Stalled, only while True.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// BerthLease binds the managed Pods of this namespace that name it (label
// berth.skaphos.io/managed-lease) to one lease at the lease API: they run
// only while this cluster holds it.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:validation:XValidation:rule="has(self.spec.leaseName) ? (has(oldSelf.spec.leaseName) ? self.spec.leaseName == oldSelf.spec.leaseName : self.spec.leaseName == oldSelf.metadata.name) : (!has(oldSelf.spec.leaseName) || oldSelf.spec.leaseName == self.metadata.name)",message="the lease a BerthLease names (spec.leaseName, or its name) cannot change: the agent holds that lease while its Pods may run; to move a workload to another lease, make a new BerthLease and delete this one"
// +kubebuilder:resource:shortName=bl
// +kubebuilder:printcolumn:name="Holder",type=string,JSONPath=`.status.currentHolder`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.leaseState`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`,priority=1
// +kubebuilder:printcolumn:name="Token",type=integer,JSONPath=`.status.fencingToken`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,description="Active or Standby when healthy; otherwise why not"
// +kubebuilder:printcolumn:name="Heartbeat",type=string,JSONPath=`.status.conditions[?(@.type=="HeartbeatHealthy")].status`,description="whether the lease API renews (holder) or answers (waiting cluster)"
// +kubebuilder:printcolumn:name="Since",type=date,JSONPath=`.status.conditions[?(@.type=="Acquired")].lastTransitionTime`,description="since when the cluster holds, or does not hold, the lease"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type BerthLease struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +kubebuilder:default={}
	Spec   BerthLeaseSpec   `json:"spec,omitempty"`
	Status BerthLeaseStatus `json:"status,omitempty"`
}

// EffectiveLeaseName is spec.leaseName, or the object's name when unset.
func (b *BerthLease) EffectiveLeaseName() string {
	if b.Spec.LeaseName != "" {
		return b.Spec.LeaseName
	}
	return b.Name
}

// BerthLeaseList is a list of BerthLeases.
//
// +kubebuilder:object:root=true
type BerthLeaseList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BerthLease `json:"items"`
}
