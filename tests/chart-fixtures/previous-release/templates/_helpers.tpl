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

{{/* The image reference. */}}
{{- define "forewarn.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
