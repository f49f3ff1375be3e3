{{/*
Names. The full name is the prefix of every object this chart makes:
fullnameOverride, else the release name when it already contains the chart name, else
<release>-<chart name>, cut to 63 characters (the DNS label limit).
*/}}
{{- define "llmop.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "llmop.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "llmop.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "llmop.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "llmop.peeringName" -}}
{{- default (include "llmop.fullname" .) .Values.peering.name }}
{{- end }}

{{- define "llmop.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "llmop.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "llmop.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: elastic-llm-operator
{{- end }}

{{/* The labels the Deployment, Service and PodDisruptionBudget select on. */}}
{{- define "llmop.selectorLabels" -}}
app.kubernetes.io/name: {{ include "llmop.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/*
Rules the operator needs in every namespace it serves (docs/operations.md explains each verb).
Used by the ClusterRole in cluster-wide mode and by the Role of each watched namespace otherwise.
*/}}
{{- define "llmop.namespacedRules" -}}
- apiGroups: [elasticllm.dev]
  resources: [llmtrainingjobs]
  verbs: [get, list, watch, patch]
- apiGroups: [elasticllm.dev]
  resources: [llmtrainingjobs/status]
  verbs: [get, patch]
- apiGroups: [elasticllm.dev]
  resources: [llmtrainingruntimes]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, delete]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, delete]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [create]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch, list]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- if .Values.rendezvous.auth.enabled }}
- apiGroups: [""]
  resources: [secrets]
  verbs: [create]
{{- end }}
{{- if .Values.rbac.podGroups }}
- apiGroups: [scheduling.x-k8s.io]
  resources: [podgroups]
  verbs: [create]
{{- end }}
{{- if include "llmop.kueueEnabled" . }}
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get, list, watch, create, patch]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [get, patch]
{{- end }}
{{- end }}

{{/* Nodes and cluster runtimes are cluster-scoped: even a namespaced install needs a ClusterRole for them. */}}
{{- define "llmop.nodeRules" -}}
- apiGroups: [""]
  resources: [nodes]
  verbs: {{ if .Values.nodeHealth.markNodes }}[get, list, watch, patch]{{ else }}[get, list, watch]{{ end }}
- apiGroups: [elasticllm.dev]
  resources: [clusterllmtrainingruntimes]
  verbs: [get, list, watch]
{{- if .Values.tenantPolicy.enabled }}
# The tenant policy: a job's namespace label (elasticllm.dev/privileged-workloads) lifts its host rules.
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get]
{{- end }}
{{- if include "llmop.kueueEnabled" . }}
- apiGroups: [kueue.x-k8s.io]
  resources: [resourceflavors]
  verbs: [get]
- apiGroups: [scheduling.k8s.io]
  resources: [priorityclasses]
  verbs: [get]
{{- end }}
{{- end }}

{{/* "true" when Kueue support is on: kueue.enabled true, or "auto" and the cluster serves Workloads. */}}
{{- define "llmop.kueueEnabled" -}}
{{- $v := toString .Values.kueue.enabled }}
{{- if or (eq $v "true") (and (eq $v "auto") (.Capabilities.APIVersions.Has "kueue.x-k8s.io/v1beta2/Workload")) }}true{{ end }}
{{- end }}

{{- define "llmop.karpenterEnabled" -}}
{{- $v := toString .Values.karpenter.enabled }}
{{- if or (eq $v "true") (and (eq $v "auto") (.Capabilities.APIVersions.Has "karpenter.sh/v1/NodePool")) }}true{{ end }}
{{- end }}

{{/* Whether the cluster serves a Prometheus Operator kind (argument: the kind, e.g. ServiceMonitor). */}}
{{- define "llmop.hasMonitoringKind" -}}
{{- if .root.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" .kind) }}true{{ end }}
{{- end }}
