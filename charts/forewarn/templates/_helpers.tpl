{{/* Chart name, truncated to 63 characters. */}}
{{- define "forewarn.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name prefix of every object: the release name, plus the chart name unless the release name has it. */}}
{{- define "forewarn.fullname" -}}
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

{{/* Labels of every object. */}}
{{- define "forewarn.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "forewarn.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: forewarn
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one role; call with (dict "ctx" $ "role" "agent"). */}}
{{- define "forewarn.selectorLabels" -}}
app.kubernetes.io/name: {{ include "forewarn.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .role }}
{{- end }}

{{/* Labels of one role's objects; call with (dict "ctx" $ "role" "agent"). */}}
{{- define "forewarn.roleLabels" -}}
{{ include "forewarn.labels" .ctx }}
app.kubernetes.io/component: {{ .role }}
{{- end }}

{{/* ServiceAccount names. */}}
{{- define "forewarn.agent.serviceAccountName" -}}
{{- default (printf "%s-agent" (include "forewarn.fullname" .)) .Values.agent.serviceAccount.name }}
{{- end }}
{{- define "forewarn.controller.serviceAccountName" -}}
{{- default (printf "%s-controller" (include "forewarn.fullname" .)) .Values.controller.serviceAccount.name }}
{{- end }}

{{/* The image reference: repository:tag, or pinned by digest
(repository:tag@sha256:..., the tag kept for the reader) when image.digest
is set. */}}
{{- define "forewarn.image" -}}
{{- $ref := printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- if .Values.image.digest }}
{{- $ref = printf "%s@%s" $ref .Values.image.digest }}
{{- end }}
{{- $ref }}
{{- end }}

{{/*
The name of the ValidatingAdmissionPolicy that confines the agents to their
own node's reports, and of its binding (the same); the controller checks
both with --agent-policy.
*/}}
{{- define "forewarn.agentPolicyName" -}}
{{- printf "%s-agent-reports" (include "forewarn.fullname" .) }}
{{- end }}

{{/*
The ValidatingAdmissionPolicy (and binding) that lets the controller change
nothing on a pod but its notice annotations.
*/}}
{{- define "forewarn.controllerPodPolicyName" -}}
{{- printf "%s-controller-pod-notices" (include "forewarn.fullname" .) }}
{{- end }}

{{/*
The ValidatingAdmissionPolicy (and binding) that lets no one but the
controller's ServiceAccount write as the controller's field manager on a
ScheduledEvent.
*/}}
{{- define "forewarn.controllerDecisionPolicyName" -}}
{{- printf "%s-controller-decisions" (include "forewarn.fullname" .) }}
{{- end }}

{{/*
"true" when the cluster serves admissionregistration.k8s.io/v1
ValidatingAdmissionPolicy (Kubernetes >= 1.30), else empty. `helm install`
and `helm upgrade` ask the cluster; `helm template` and `helm lint` know only
what --api-versions names.
*/}}
{{- define "forewarn.vapServed" -}}
{{- if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" }}true{{ end }}
{{- end }}

{{/*
Why the agents would not be confined by the admission policy; empty when
they are.
*/}}
{{- define "forewarn.agentsUnconfined" -}}
{{- if not .Values.admissionPolicy.enabled -}}
admissionPolicy.enabled is false
{{- else if not (include "forewarn.vapServed" .) -}}
the cluster does not serve the admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy API
{{- else if not (has "Deny" .Values.admissionPolicy.validationActions) -}}
admissionPolicy.validationActions has no Deny
{{- end -}}
{{- end }}

{{/*
The rules both roles need to check scrapers' tokens (--metrics-auth
kubernetes), when metrics.auth.enabled: indented as items of a rules list.
*/}}
{{- define "forewarn.metricsAuthRules" -}}
{{- if .Values.metrics.auth.enabled }}
  - apiGroups: ["authentication.k8s.io"]
    resources: ["tokenreviews"]
    verbs: ["create"]
  - apiGroups: ["authorization.k8s.io"]
    resources: ["subjectaccessreviews"]
    verbs: ["create"]
{{- end }}
{{- end }}

{{/*
The Secret and key of the token the PodMonitor sends with
metrics.auth.enabled: metrics.auth.podMonitorToken's, or the chart's
<fullname>-metrics-scraper-token (templates/metrics-auth.yaml). Rendered
as the `credentials` of an `authorization`.
*/}}
{{- define "forewarn.podMonitorCredentials" -}}
{{- with .Values.metrics.auth.podMonitorToken }}
{{- if .secretName -}}
name: {{ .secretName }}
key: {{ .key }}
{{- else -}}
name: {{ include "forewarn.fullname" $ }}-metrics-scraper-token
key: token
{{- end }}
{{- end }}
{{- end }}

{{/*
The Secret holding the controller's webhooks file, or "" when no webhook is
configured: controller.webhooks.existingSecret, else the chart's own
(webhooks-secret.yaml) when controller.webhooks.config is set.
*/}}
{{- define "forewarn.webhooksSecret" -}}
{{- if .Values.controller.webhooks.existingSecret -}}
{{- .Values.controller.webhooks.existingSecret -}}
{{- else if .Values.controller.webhooks.config -}}
{{- include "forewarn.fullname" . }}-webhooks
{{- end -}}
{{- end -}}

{{/*
The agent container's args, env, ports and probes: the same in the Linux
agents' DaemonSet and the Windows agents' (agent.windows).
*/}}
{{- define "forewarn.agent.containerCommon" -}}
args:
  - --log-format={{ .Values.logFormat }}
  - --log-level={{ .Values.logLevel }}
  - agent
  {{- if .Values.agent.metrics.bindAddress }}
  - --metrics-addr={{ .Values.agent.metrics.bindAddress }}:{{ .Values.agent.metrics.port }}
  {{- else }}
  {{- /* The node's own IP (downward API): not every address of the node. */}}
  - --metrics-addr=0.0.0.0:{{ .Values.agent.metrics.port }}
  - --metrics-host=$(HOST_IP)
  {{- end }}
  {{- with .Values.agent.imdsUrl }}
  - --imds-url={{ . }}
  {{- end }}
  - --poll-interval={{ .Values.agent.pollInterval }}
  - --imds-timeout={{ .Values.agent.imdsTimeout }}
  - --approval-fallback={{ .Values.agent.approvalFallback }}
  - --witnesses={{ .Release.Namespace }}/{{ .Values.controller.witnessesConfigMap }}
  {{- if .Values.metrics.auth.enabled }}
  - --metrics-auth=kubernetes
  {{- end }}
  {{- range .Values.agent.extraArgs }}
  - {{ . | quote }}
  {{- end }}
env:
  - name: NODE_NAME
    valueFrom:
      fieldRef:
        fieldPath: spec.nodeName
  {{- if not .Values.agent.metrics.bindAddress }}
  - name: HOST_IP
    valueFrom:
      fieldRef:
        fieldPath: status.hostIP
  {{- end }}
  {{- with .Values.agent.extraEnv }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
ports:
  - name: metrics
    containerPort: {{ .Values.agent.metrics.port }}
    protocol: TCP
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  {{- toYaml .Values.agent.livenessProbe | nindent 2 }}
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  {{- toYaml .Values.agent.readinessProbe | nindent 2 }}
{{- end }}
