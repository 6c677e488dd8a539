{{/* Names and labels. */}}
{{- define "kubesweep.fullname" -}}
{{- if contains "kubesweep" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-kubesweep" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kubesweep.operatorName" -}}{{ include "kubesweep.fullname" . }}-operator{{- end -}}
{{- define "kubesweep.mlflowName" -}}{{ include "kubesweep.fullname" . }}-mlflow{{- end -}}

{{- define "kubesweep.serviceAccountName" -}}
{{- if .Values.serviceAccount.name -}}{{ .Values.serviceAccount.name }}{{- else -}}{{ include "kubesweep.operatorName" . }}{{- end -}}
{{- end -}}

{{- define "kubesweep.labels" -}}
app.kubernetes.io/name: kubesweep
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kubesweep.selector" -}}
app.kubernetes.io/name: kubesweep
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* A selector of trial pods: every pod of a sweep (kubesweep.io/sweep) but its tuner. */}}
{{- define "kubesweep.trialPods" -}}
matchExpressions:
  - {key: kubesweep.io/sweep, operator: Exists}
  - {key: app.kubernetes.io/component, operator: NotIn, values: [tuner]}
{{- end -}}

{{/* An image reference pinned by digest: repository@sha256:... */}}
{{- define "kubesweep.image" -}}
{{- printf "%s@%s" .repository .digest -}}
{{- end -}}

{{/* The namespaces the operator serves (empty with allNamespaces). Named, never implied: the release namespace
holds MLflow's store and the chart's Secrets, so it is served only when listed. */}}
{{- define "kubesweep.watchNamespaces" -}}
{{- if not .Values.watch.allNamespaces -}}
{{- if .Values.watch.namespaces -}}{{ join "," .Values.watch.namespaces }}{{- else -}}
{{- fail "watch.namespaces: name the namespaces whose Sweeps the operator serves (--set watch.namespaces={team-a}), or set watch.allNamespaces=true; the release namespace, where MLflow's store lives, is served only when listed" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kubesweep.trackingUri" -}}
{{- if .Values.mlflow.enabled -}}
{{- printf "http://%s.%s.svc:%d" (include "kubesweep.mlflowName" .) .Release.Namespace (int .Values.mlflow.port) -}}
{{- else -}}
{{- .Values.tracking.uri -}}
{{- end -}}
{{- end -}}

{{/* The restricted Pod Security profile, for every container of the chart. */}}
{{- define "kubesweep.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The Host headers the MLflow server accepts (comma-separated; `*` matches anything, the port included). */}}
{{- define "kubesweep.mlflowAllowedHosts" -}}
{{- $name := include "kubesweep.mlflowName" . -}}
{{- $ns := .Release.Namespace -}}
{{- $hosts := list $name (printf "%s:*" $name) (printf "%s.%s" $name $ns) (printf "%s.%s:*" $name $ns) (printf "%s.%s.svc*" $name $ns) -}}
{{- $hosts = concat $hosts (list "localhost" "localhost:*" "127.0.0.1" "127.0.0.1:*" "[::1]" "[[]::1]:*" "10.*" "192.168.*") -}}
{{- range $i := until 16 }}{{ $hosts = append $hosts (printf "172.%d.*" (add 16 $i)) }}{{ end -}}
{{- join "," (concat $hosts .Values.mlflow.allowedHosts) -}}
{{- end -}}

{{/* MLflow authentication: the release's Secret (both users) and, in each served namespace, the trials' one. */}}
{{- define "kubesweep.mlflowAuthSecret" -}}{{ include "kubesweep.mlflowName" . }}-auth{{- end -}}
{{- define "kubesweep.trialsSecret" -}}kubesweep-mlflow-trials{{- end -}}
{{- define "kubesweep.mlflowAuth" -}}
{{- if and .Values.mlflow.enabled .Values.mlflow.auth.enabled -}}
{{- include "kubesweep.mlflowUsersApart" .Values.mlflow.auth -}}
true
{{- end -}}
{{- end -}}

{{/* No namespace's MLflow user (namespaceUserPrefix + namespace) can be the operator's or the admin's: that
namespace's trials would be given the operator's (or admin's) user, with its password, by the Secret
kubesweep-mlflow-trials. A namespace may be served later (or its user made by hand), so no name beginning with the
prefix is allowed, whatever is served now. */}}
{{- define "kubesweep.mlflowUsersApart" -}}
{{- range $key := list "operatorUsername" "adminUsername" -}}
{{- $name := index $ $key -}}
{{- if hasPrefix $.namespaceUserPrefix $name -}}
{{- fail (printf "mlflow.auth.%s %q begins with mlflow.auth.namespaceUserPrefix %q: the MLflow user of namespace %q would be that user, and its trials would log with its password; choose a prefix no other user's name begins with" $key $name $.namespaceUserPrefix (trimPrefix $.namespaceUserPrefix $name)) -}}
{{- end -}}
{{- end -}}
{{- if eq .operatorUsername .adminUsername -}}
{{- fail (printf "mlflow.auth.operatorUsername and mlflow.auth.adminUsername are both %q: the operator would be MLflow's admin" .operatorUsername) -}}
{{- end -}}
{{- end -}}

{{/* The image tuner Jobs run: tuner.image when set, else the operator's own. */}}
{{- define "kubesweep.tunerImage" -}}
{{- if .Values.tuner.image.digest -}}
{{- printf "%s@%s" (.Values.tuner.image.repository | default .Values.operator.image.repository) .Values.tuner.image.digest -}}
{{- else -}}
{{- include "kubesweep.image" .Values.operator.image -}}
{{- end -}}
{{- end -}}

{{/* The MLflow server's (and its init container's) settings of the basic-auth app. */}}
{{- define "kubesweep.mlflowAuthEnv" -}}
- name: MLFLOW_AUTH_CONFIG_PATH
  value: /etc/mlflow-auth/basic_auth.ini
- name: MLFLOW_AUTH_ADMIN_USERNAME
  valueFrom: {secretKeyRef: {name: {{ include "kubesweep.mlflowAuthSecret" . }}, key: admin-username}}
- name: MLFLOW_AUTH_ADMIN_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ include "kubesweep.mlflowAuthSecret" . }}, key: admin-password}}
- name: MLFLOW_FLASK_SERVER_SECRET_KEY
  valueFrom: {secretKeyRef: {name: {{ include "kubesweep.mlflowAuthSecret" . }}, key: flask-secret-key}}
{{- end -}}
